"""Every hostile case, through every CLI verb, as a real audited subprocess.

For each (case, verb): the documented exit code; for exit 2 exactly one line on
stderr naming the problem; never a traceback; nothing opened or listed outside the
checkpoint folder (and, for diff, the reference folder); the folder unchanged except
for the manifest a successful publish writes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoints import run_cli, snapshot, write_checkpoint
from corpus import CASES, Case

AUDITED_CLI = Path(__file__).with_name("audited_cli.py")
PARAMS = [(case, verb) for case in CASES for verb in case.expect]


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
    print(f"hostile corpus: {len(CASES)} cases, {len(PARAMS)} case x verb runs")
    assert len(CASES) >= 40
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case, verb", PARAMS, ids=[f"{c.name}-{v}" for c, v in PARAMS])
def test_case(tmp_path: Path, pristine: dict[str, Path], case: Case, verb: str) -> None:
    box = tmp_path / "box"  # the case folder and nothing else lives here
    folder = box / "ckpt"
    shutil.copytree(pristine["published" if case.published else "plain"], folder, symlinks=True)
    case.damage(folder)
    before = snapshot(folder) if folder.is_dir() else None
    args = [verb, str(folder)] if verb != "diff" else [verb, str(pristine["reference"]), str(folder)]
    log = tmp_path / "touched.json"
    result = subprocess.run(
        [sys.executable, str(AUDITED_CLI), str(log), *args], capture_output=True, text=True, timeout=60
    )
    expected = case.expect[verb]
    assert result.returncode == expected, f"{case.name}/{verb}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    if expected == 2:
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("ckptpub: error: "), result.stderr
        fragment = case.message if verb == "publish" or case.published else "no ckptpub.json"
        assert fragment in result.stderr, result.stderr
        assert result.stdout == ""
    allowed = [os.path.realpath(folder)] + ([os.path.realpath(pristine["reference"])] if verb == "diff" else [])
    for path in json.loads(log.read_text()):
        real = os.path.realpath(os.path.join(os.getcwd(), path))
        assert any(real == a or real.startswith(a + os.sep) for a in allowed), f"{case.name}/{verb} touched {path}"
    if before is not None:
        after = snapshot(folder)
        if verb == "publish" and expected == 0:
            after.pop("ckptpub.json", None), before.pop("ckptpub.json", None)
        assert after == before, f"{case.name}/{verb} changed the folder"
