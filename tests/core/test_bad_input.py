"""Unusable input the hostile corpus (tests/hostile) cannot express: permissions, and a folder that is a file.

Each ends with exit 2, one line, and the folder unchanged.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hostile.privileges import without_privileges
from support.checkpoints import run_cli, snapshot, write_checkpoint


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt")
    assert run_cli("publish", folder).returncode == 0
    (folder / "tokenizer.json").chmod(0)
    before = snapshot(folder)
    for verb in ("publish", "verify"):
        command = without_privileges() + [sys.executable, "-m", "ckptpub", verb, str(folder)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, (verb, result.stdout, result.stderr)
        assert result.stderr == "ckptpub: error: tokenizer.json: cannot open: Permission denied\n", (
            result.stderr
        )
    assert snapshot(folder) == before


def test_folder_that_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    for verb in ("publish", "verify", "ls"):
        result = run_cli(verb, path)
        assert result.returncode == 2, verb
        assert result.stderr == f"ckptpub: error: {path}: not a folder\n", (verb, result.stderr)
    result = run_cli("show", path)  # show also takes a manifest file; this one is not JSON
    assert result.returncode == 2
    assert "manifest is not valid JSON" in result.stderr
