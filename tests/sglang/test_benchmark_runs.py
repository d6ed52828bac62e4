"""``benchmarks/bench_sglang_stream.py`` still runs, at a toy size, in ``.venv-sglang``.

No figure is checked (docs/performance.md has them, measured at real sizes): a benchmark
that no longer runs would otherwise be found only when someone needs its numbers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_sglang_stream.py"


def test_bench_sglang_stream_times_the_verified_stream_beside_the_plain_one(tmp_path: Path) -> None:
    arguments = ["--dir", str(tmp_path / "qwen3"), "--layers", "1", "--repeat", "1"]
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *arguments], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = [line.split("|")[1].strip() for line in result.stdout.splitlines() if line.startswith("| ")]
    assert rows == ["stream", "plain", "verified"]
    assert "verified / plain (medians): wall " in result.stdout
