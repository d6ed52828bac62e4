"""Malformed checkpoints: publish refuses them with exit 2, one line, and the folder unchanged."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import pytest

from checkpoints import run_cli, snapshot, write_checkpoint


def shard_bytes(header: object, data: bytes = b"", *, raw_header: bytes | None = None) -> bytes:
    encoded = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data


def write_shard(folder: Path, content: bytes) -> None:
    (folder / "model.safetensors").write_bytes(content)


F32_4 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}

CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated shard": (lambda f: write_shard(f, (f / "model.safetensors").read_bytes()[:-10]), "past the end of the file"),
    "shorter than prefix": (lambda f: write_shard(f, b"\x01\x02"), "no header length"),
    "absurd header length": (lambda f: write_shard(f, struct.pack("<Q", 2**63) + b"{}"), "exceeds the 100000000-byte limit"),
    "header past end": (lambda f: write_shard(f, struct.pack("<Q", 5000) + b"{}"), "runs past the end of the file"),
    "header not json": (lambda f: write_shard(f, shard_bytes(None, raw_header=b"{nope")), "not valid JSON"),
    "header not object": (lambda f: write_shard(f, shard_bytes([1, 2])), "not a JSON object"),
    "header not utf-8": (lambda f: write_shard(f, shard_bytes(None, raw_header=b'{"\xff": 1}')), "not valid UTF-8"),
    "unknown dtype": (lambda f: write_shard(f, shard_bytes({"w": dict(F32_4, dtype="F128")}, bytes(16))), "unknown dtype"),
    "shape/size mismatch": (lambda f: write_shard(f, shard_bytes({"w": dict(F32_4, shape=[5])}, bytes(16))), "needs 20 bytes"),
    "overlapping offsets": (
        lambda f: write_shard(f, shard_bytes({"a": F32_4, "b": dict(F32_4, data_offsets=[8, 24])}, bytes(24))),
        "overlaps",
    ),
    "out of range offsets": (lambda f: write_shard(f, shard_bytes({"w": dict(F32_4, data_offsets=[16, 32])}, bytes(16))), "hole"),
    "past end offsets": (
        lambda f: write_shard(f, shard_bytes({"a": F32_4, "b": dict(F32_4, data_offsets=[16, 32])}, bytes(16))),
        "past the end of the file",
    ),
    "trailing bytes": (lambda f: write_shard(f, shard_bytes({"w": F32_4}, bytes(20))), "4 bytes after the last tensor"),
    "duplicate tensor names": (
        lambda f: write_shard(f, shard_bytes(None, bytes(32), raw_header=json.dumps({"w": F32_4}).encode()[:-1] + b', "w": ' + json.dumps(dict(F32_4, data_offsets=[16, 32])).encode() + b"}")),
        "duplicate key 'w'",
    ),
    "index names a missing shard": (
        lambda f: (f / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "model-00002-of-00002.safetensors"}})),
        "which is missing",
    ),
    "config not json": (lambda f: (f / "config.json").write_text("{"), "config.json: config is not valid JSON"),
    "symlink out of folder": (lambda f: os.symlink("/etc/hostname", f / "stolen.txt"), "symlink points outside"),
    "symlink loop": (lambda f: os.symlink("loop", f / "loop"), "symlink loop"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_publish_refuses_malformed_input(tmp_path: Path, case: str) -> None:
    folder = write_checkpoint(tmp_path / "ckpt")
    damage, message = CASES[case]
    damage(folder)
    before = snapshot(folder)
    result = run_cli("publish", folder)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("ckptpub: error: "), result.stderr
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert snapshot(folder) == before
    assert not (folder / "ckptpub.json").exists()


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


def test_manifest_symlink_is_refused(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt")
    assert run_cli("publish", folder).returncode == 0
    os.replace(folder / "ckptpub.json", tmp_path / "elsewhere.json")
    os.symlink(tmp_path / "elsewhere.json", folder / "ckptpub.json")
    result = run_cli("show", folder)
    assert result.returncode == 2 and "is a symlink" in result.stderr


def test_edited_identity_is_refused(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt")
    assert run_cli("publish", folder).returncode == 0
    manifest = json.loads((folder / "ckptpub.json").read_text())
    manifest["identity"] = "blake3:" + "1" * 64
    (folder / "ckptpub.json").write_text(json.dumps(manifest))
    for verb in ("verify", "show"):
        result = run_cli(verb, folder)
        assert result.returncode == 2 and "does not match the manifest's own entries" in result.stderr


def test_manifest_of_another_checkpoint_is_a_mismatch(tmp_path: Path) -> None:
    a = write_checkpoint(tmp_path / "a")
    b = write_checkpoint(tmp_path / "b", config={"model_type": "other"})
    assert run_cli("publish", a).returncode == 0
    (b / "ckptpub.json").write_bytes((a / "ckptpub.json").read_bytes())
    result = run_cli("verify", b)
    assert result.returncode == 1 and "config.json: FAILED" in result.stdout


def test_reordered_manifest_still_reads(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt")
    assert run_cli("publish", folder).returncode == 0
    manifest = json.loads((folder / "ckptpub.json").read_text())
    reordered = {k: manifest[k] for k in reversed(list(manifest))}
    (folder / "ckptpub.json").write_text(json.dumps(reordered, indent=4))
    assert run_cli("verify", folder).returncode == 0
