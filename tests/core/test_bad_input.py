"""Unusable input the hostile corpus (tests/hostile) cannot express: permissions, and a folder that is a file.

Each ends with exit 2, one line, and the folder unchanged.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from checkpoints import run_cli, snapshot, write_checkpoint


def as_unprivileged_user() -> list[str]:
    """A command prefix that drops root, so permissions apply (CI runs as root)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: file permissions cannot be exercised")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_unreadable_file_is_named() -> None:
    box = Path(tempfile.mkdtemp(prefix="ckptpub-perm-"))  # outside pytest's root-only tmp dir
    try:
        box.chmod(0o755)
        folder = write_checkpoint(box / "ckpt")
        assert run_cli("publish", folder).returncode == 0
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        (folder / "tokenizer.json").chmod(0)
        before = snapshot(folder)
        for verb in ("publish", "verify"):
            command = as_unprivileged_user() + [sys.executable, "-m", "ckptpub", verb, str(folder)]
            result = subprocess.run(command, capture_output=True, text=True, timeout=60)
            assert result.returncode == 2, (verb, result.stdout, result.stderr)
            assert result.stderr == "ckptpub: error: tokenizer.json: cannot open: Permission denied\n", result.stderr
        assert snapshot(folder) == before
    finally:
        shutil.rmtree(box, ignore_errors=True)


def test_folder_that_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    for verb in ("publish", "verify", "ls"):
        result = run_cli(verb, path)
        assert result.returncode == 2 and result.stderr == f"ckptpub: error: {path}: not a folder\n", (verb, result.stderr)
    result = run_cli("show", path)  # show also takes a manifest file; this one is not JSON
    assert result.returncode == 2 and "manifest is not valid JSON" in result.stderr
