"""Every hostile case, through every verb and both entry points (CLI, Python API), in audited subprocesses.

For each (case, verb, entry point): the documented exit code; for exit 2 exactly one
line on stderr naming the problem; never a traceback (the API: never an exception but
``CkptpubError``); no hang (every run has a timeout, and a timeout fails the test);
nothing opened or listed outside the checkpoint folder (and, for diff, the reference
folder); the folder unchanged except for the manifest a successful publish writes.

Every publish that succeeds is followed by ``verify``, which must accept what it wrote.
``verify-pinned`` is ``verify --expect-identity`` with the identity the untouched
checkpoint publishes to: the guarantee a deployment relies on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.checkpoints import run_cli, snapshot, write_checkpoint

import ckptpub
from tests.hostile.corpus import CASES, RUN_CASES, Case, RunCase
from tests.hostile.privileges import without_privileges

AUDITED_CLI = Path(__file__).with_name("audited_cli.py")
ENTRIES = ("cli", "api")
PARAMS = [(case, verb, entry) for case in CASES for verb in case.expect for entry in ENTRIES]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("corpus")
    plain = write_checkpoint(root / "plain")
    published = write_checkpoint(root / "published")
    reference = write_checkpoint(root / "reference")
    for folder in (published, reference):
        assert run_cli("publish", folder).returncode == 0
    return {"plain": plain, "published": published, "reference": reference}


def test_corpus_size() -> None:
    runs = len(PARAMS) + len(RUN_PARAMS)
    print(
        f"hostile corpus: {len(CASES)} folder cases x verbs x {len(ENTRIES)} entry points "
        f"= {len(PARAMS)} runs; {len(RUN_CASES)} run-folder cases x {len(RUN_VIEWS)} views = "
        f"{len(RUN_PARAMS)} runs; {runs} runs in all"
    )
    assert len(CASES) >= 100
    assert len({c.name for c in CASES}) == len(CASES)


def audited(log: Path, entry: str, args: list[str], prefix: list[str] = ()) -> subprocess.CompletedProcess:
    """One audited run; a hang is a failure (TimeoutExpired fails the test), never a wait without end."""
    return subprocess.run(
        [*prefix, sys.executable, str(AUDITED_CLI), str(log), entry, *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def assert_stayed_inside(log: Path, allowed: list[str], what: str) -> None:
    for path, nofollow in json.loads(log.read_text()):
        path = os.path.join(os.getcwd(), path)
        real = (
            os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
            if nofollow
            else os.path.realpath(path)
        )
        assert any(real == a or real.startswith(a + os.sep) for a in allowed), f"{what} touched {path}"


def assert_one_line_error(result: subprocess.CompletedProcess, fragment: str) -> None:
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("ckptpub: error: "), result.stderr
    assert fragment in result.stderr, result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(("case", "verb", "entry"), PARAMS, ids=[f"{c.name}-{v}-{e}" for c, v, e in PARAMS])
def test_case(tmp_path: Path, pristine: dict[str, Path], case: Case, verb: str, entry: str) -> None:
    box = tmp_path / "box"  # the case folder and nothing else lives here
    folder = box / "ckpt"
    shutil.copytree(pristine["published" if case.published else "plain"], folder, symlinks=True)
    case.damage(folder)
    before = snapshot(folder) if folder.is_dir() else None
    reference = str(pristine["reference"])
    if verb == "diff":
        args = [verb, reference, str(folder)]
    elif verb == "verify-pinned":
        args = [
            "verify",
            "--expect-identity",
            ckptpub.read_manifest(pristine["reference"]).identity,
            str(folder),
        ]
    else:
        args = [verb, str(folder)]
    log = tmp_path / "touched.json"
    result = audited(log, entry, args)
    expected = case.expect[verb]
    assert result.returncode == expected, (
        f"{case.name}/{verb}/{entry}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    assert "Traceback" not in result.stderr
    if expected == 2:
        assert_one_line_error(
            result, case.message if verb == "publish" or case.published else "no ckptpub.json"
        )
    allowed = [os.path.realpath(folder)] + ([os.path.realpath(reference)] if verb == "diff" else [])
    assert_stayed_inside(log, allowed, f"{case.name}/{verb}/{entry}")
    if before is not None:
        after = snapshot(folder)
        if verb == "publish" and expected == 0:
            after.pop("ckptpub.json", None), before.pop("ckptpub.json", None)
        assert after == before, f"{case.name}/{verb}/{entry} changed the folder"
    if verb == "publish" and expected == 0:  # publish writes only what verify accepts
        check = audited(log, "cli", ["verify", str(folder)])
        assert check.returncode == 0, (
            f"{case.name}/{entry}: verify after publish: {check.stdout}{check.stderr}"
        )


RUN_VIEWS = (("ls",), ("ls", "--tree"), ("log",))
RUN_PARAMS = [(case, view) for case in RUN_CASES for view in RUN_VIEWS]


@pytest.mark.parametrize(("case", "view"), RUN_PARAMS, ids=[f"{c.name}-{' '.join(v)}" for c, v in RUN_PARAMS])
def test_run_folder_case(tmp_path: Path, pristine: dict[str, Path], case: RunCase, view: tuple) -> None:
    """Every view of a damaged run folder (the table, the lineage): each checkpoint listed or named
    unusable, never left out, and the same summary line and exit code."""
    run = tmp_path / "box" / "run"
    for step in (10, 20):
        shutil.copytree(pristine["published"], run / f"checkpoint-{step}", symlinks=True)
    case.damage(run)
    log = tmp_path / "touched.json"
    unprivileged = without_privileges()  # so a mode-000 folder is unreadable
    result = audited(log, "cli", [*view, str(run)], unprivileged)
    assert result.returncode == case.exit_code, (
        f"{case.name}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    assert "Traceback" not in result.stderr
    rows = [line.split("  (")[0] for line in result.stdout.splitlines()]  # the tree's "(=prev)" left out
    for name in case.listed:
        assert any(row.endswith(f"  {name}") for row in rows), (name, result.stdout)
    for name in case.unusable:
        assert any("UNUSABLE" in row and row.endswith(f"  {name}") for row in rows), (name, result.stdout)
    assert result.stderr.count("\n") == 1, result.stderr
    assert_stayed_inside(log, [os.path.realpath(run)], case.name)
