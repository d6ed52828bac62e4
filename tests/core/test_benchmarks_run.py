"""The benchmarks still run, at toy sizes, against the current manifest format and CLI.

No figure is checked (speed is measured by running them at real sizes, see
docs/performance.md); a benchmark that no longer runs would otherwise only be found
when someone needs its numbers (bench_hash.py read ckptpub/2 manifests as JSON for a while).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

pytestmark = pytest.mark.skipif(
    shutil.which("b3sum") is None, reason="b3sum (the reference) is not installed"
)


def run(script: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout


def table_rows(output: str) -> dict[str, list[str]]:
    """Markdown table rows by their first cell."""
    rows = [line.strip("|").split("|") for line in output.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def test_bench_scale_times_every_command(tmp_path: Path) -> None:
    moe = tmp_path / "moe"
    run("make_moe_checkpoint.py", str(moe), "--layers", "2", "--experts", "16", "--shards", "3")
    checkout = Path(__file__).resolve().parents[2]  # against itself: the comparison table's every row
    output = run(
        "bench_scale.py",
        "--folder",
        str(moe),
        "--work",
        str(tmp_path / "work"),
        "--repeat",
        "1",
        "--against",
        str(checkout),
    )
    rows = table_rows(output.split("This checkout against")[0])
    compared = table_rows(output.split("This checkout against")[1])
    assert set(compared) == {"command", *rows} - {"b3sum (shards)"}, compared
    timed = (
        "publish",
        "verify",
        "show",
        "diff (1 tensor changed)",
        "ls (2 checkpoints)",
        "log (2 checkpoints)",
    )
    for command in timed:  # a subprocess each: never under the table's 1 ms resolution
        assert float(rows[command][0]) > 0, rows  # wall
        assert float(rows[command][2]) > 0, rows  # CPU
    # In process, at this toy size the key can take under 0.5 ms and print as 0.000: timed, as a number.
    assert float(rows["engine key (in process)"][0]) >= 0, rows
    assert float(rows["engine key (in process)"][2]) >= 0, rows


def test_bench_floor_times_the_floor_beside_publish(tmp_path: Path) -> None:
    moe = tmp_path / "moe"
    run("make_moe_checkpoint.py", str(moe), "--layers", "2", "--experts", "16", "--shards", "3")
    rows = table_rows(run("bench_floor.py", "--folder", str(moe), "--repeat", "1"))
    for name in (
        "floor: decode, hash, encode; one process",
        "floor: the same over two processes",
        "ckptpub publish",
    ):
        assert float(rows[name][0]) > 0, rows  # wall
        assert float(rows[name][2]) > 0, rows  # CPU
    assert (moe / "ckptpub.json").exists()  # the publish beside the floor really ran


def test_bench_hash_compares_with_b3sum(tmp_path: Path) -> None:
    output = run(
        "bench_hash.py",
        "--gb",
        "0.02",
        "--dir",
        str(tmp_path / "ckpt"),
        "--rounds",
        "1",
        "--cold-rounds",
        "0",
    )
    rows = table_rows(output)
    assert "ckptpub publish" in rows, output
    assert "ckptpub verify" in rows, output
    assert rows["ckptpub publish"][3].endswith("x"), rows  # the ratio to b3sum


def test_bench_listing_times_ls_and_log_beside_show(tmp_path: Path) -> None:
    checkout = Path(__file__).resolve().parents[2]  # against itself: the before/after columns filled
    sizes = ("--layers", "2", "--experts", "16", "--shards", "3", "--steps", "3")
    output = run(
        "bench_listing.py", *sizes, "--work", str(tmp_path), "--repeat", "1", "--against", str(checkout)
    )
    rows = table_rows(output)
    assert set(rows) == {"command", "show (one step)", "ls (3 steps)", "log (3 steps)"}, output
    for name in ("show (one step)", "ls (3 steps)", "log (3 steps)"):
        assert float(rows[name][0]) > 0, rows  # this checkout's wall
        assert float(rows[name][3]) > 0, rows  # the other's
    assert len(list((tmp_path / "run").glob("checkpoint-*"))) == 3


def test_bench_s3_times_verify_beside_a_plain_download() -> None:
    output = run("bench_s3.py", "--shards", "3", "--gb", "0.01", "--tensor-mb", "1", "--latency-ms", "0", "5")
    rows = table_rows(output)
    assert {"0 ms", "5 ms"} <= set(rows), output
    assert rows["5 ms"][4].endswith("x"), rows  # verify / download
    assert int(rows["5 ms"][5]) > 0, rows  # verify's requests, counted by the proxy
