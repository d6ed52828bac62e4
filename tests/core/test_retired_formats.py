"""A folder published before ``ckptpub/3`` settled (``ckptpub/1``, ``/2``; never released) is refused.

Every command that reads a manifest ends with exit 2 and one line on stderr naming the
format and the command that publishes the folder again, never a traceback; running that
command makes the folder usable. The manifests are the bytes those formats' writers
wrote (``tests/vectors/retired``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.checkpoints import run_cli, with_retired_manifest, write_checkpoint

import ckptpub

RETIRED = ("ckptpub/1", "ckptpub/2")


def refusal(folder: Path, version: str) -> str:
    """The one line: the manifest, its format, the format read, and the command that publishes it again."""
    return (
        f"{folder / 'ckptpub.json'}: format {version!r} is no longer read "
        f"(ckptpub reads 'ckptpub/3'); publish it again: ckptpub publish {folder}"
    )


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A run folder with a current step and one published in each retired format."""
    for name in ("current", *RETIRED):
        folder = write_checkpoint(tmp_path / "runs" / name.replace("/", "-"), extra_files=False)
        ckptpub.publish(folder)
        if name != "current":
            with_retired_manifest(folder, name)
    return tmp_path / "runs"


@pytest.mark.parametrize("version", RETIRED)
@pytest.mark.parametrize("verb", [["verify"], ["show"], ["show", "--json"]])
def test_a_retired_manifest_is_refused_in_one_line(runs: Path, version: str, verb: list[str]) -> None:
    folder = runs / version.replace("/", "-")
    result = run_cli(*verb, folder)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.splitlines() == [f"ckptpub: error: {refusal(folder, version)}"]


@pytest.mark.parametrize("version", RETIRED)
def test_diff_names_the_side_in_a_retired_format(runs: Path, version: str) -> None:
    folder = runs / version.replace("/", "-")
    for a, b in ((runs / "current", folder), (folder, runs / "current")):
        result = run_cli("diff", a, b)
        assert (result.returncode, result.stdout) == (2, ""), result.stderr
        assert result.stderr.splitlines() == [f"ckptpub: error: {refusal(folder, version)}"]


def test_ls_lists_retired_steps_as_unusable_each_with_its_line(runs: Path) -> None:
    result = run_cli("ls", runs)
    assert result.returncode == 2, result.stderr
    rows = {line.split()[-1]: line.split()[1] for line in result.stdout.splitlines()[1:] if line[:1] != "#"}
    assert rows["ckptpub-1"] == rows["ckptpub-2"] == "UNUSABLE"
    assert ckptpub.read_manifest(runs / "current").identity.startswith(rows["current"].rstrip("."))
    notes = [line for line in result.stdout.splitlines() if line.startswith("# ")]
    assert notes == [f"# {refusal(runs / v.replace('/', '-'), v)}" for v in RETIRED]
    assert result.stderr.splitlines() == [f"ckptpub: 1 published checkpoint under {runs}, 2 unusable"]


@pytest.mark.parametrize("version", RETIRED)
def test_the_command_the_refusal_names_makes_the_folder_usable(runs: Path, version: str) -> None:
    folder = runs / version.replace("/", "-")
    command = refusal(folder, version).rpartition("publish it again: ")[2].split()
    assert command[:2] == ["ckptpub", "publish"]
    assert run_cli(*command[1:]).returncode == 0
    assert run_cli("verify", folder).returncode == 0
