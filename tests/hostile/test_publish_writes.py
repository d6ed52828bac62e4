"""Publish writes only what verify accepts, or nothing.

These are the cases the corpus cannot set up by damaging a folder.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.checkpoints import run_cli, snapshot, write_checkpoint

import ckptpub
import ckptpub._operations.publishing
from tests.hostile.privileges import without_privileges


def test_folder_whose_mtime_cannot_be_restored(tmp_path: Path) -> None:
    """A folder owned by someone else but writable: the manifest lands, its mtime stays changed (EPERM).

    The publish happened, so it succeeds (exit 0) and says what it could not do in a warning."""
    prefix = without_privileges()
    if not prefix and os.geteuid() != 0:
        pytest.skip("needs root to give the folder to another user")
    folder = write_checkpoint(tmp_path / "ckpt")
    tmp_path.chmod(0o755)
    os.chown(folder, 65534, 65534)
    folder.chmod(0o777)
    result = subprocess.run(
        [*prefix, sys.executable, "-m", "ckptpub", "publish", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "modification time" in line]
    assert warnings == [
        f"ckptpub: {folder}: published ckptpub.json (a valid manifest), but the folder's modification "
        "time could not be restored: Operation not permitted"
    ], result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout.strip() == ckptpub.read_manifest(folder).identity
    assert run_cli("verify", folder).returncode == 0  # what is left is a valid manifest
    assert [p.name for p in folder.iterdir() if p.name.startswith(".ckptpub.json.")] == []


def test_manifest_over_the_read_limit_is_not_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit readers apply, lowered here so a tiny folder exceeds it (a real one needs ~250k tensors)."""
    folder = write_checkpoint(tmp_path / "ckpt")
    monkeypatch.setattr(ckptpub._operations.publishing, "MAX_MANIFEST_BYTES", 1000)
    with pytest.raises(
        ckptpub.CkptpubError, match="over the 1000-byte manifest limit readers accept; not written"
    ):
        ckptpub.publish(folder)
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "logs",
        "model.safetensors",
        "optimizer.pt",
        "tokenizer.json",
    ]


@pytest.mark.parametrize(
    "what", ["dangling symlink", "symlink to a file inside", "symlink out of the folder", "FIFO", "socket"]
)
def test_whatever_is_at_ckptpub_json_publish_leaves_a_plain_manifest(tmp_path: Path, what: str) -> None:
    folder = write_checkpoint(tmp_path / "ckpt")
    outside = tmp_path / "outside.json"
    outside.write_text("untouched")
    manifest = folder / "ckptpub.json"
    if what == "dangling symlink":
        os.symlink("gone.json", manifest)
    elif what == "symlink to a file inside":
        os.symlink("tokenizer.json", manifest)
    elif what == "symlink out of the folder":
        os.symlink(outside, manifest)
    else:
        os.mknod(manifest, 0o644 | (0o010000 if what == "FIFO" else 0o140000))
    result = run_cli("publish", folder, timeout=60)
    assert result.returncode == 0, result.stderr
    assert manifest.is_file()
    assert not manifest.is_symlink()
    assert run_cli("verify", folder).returncode == 0
    assert outside.read_text() == "untouched"
    assert (folder / "tokenizer.json").read_text().startswith('{"version"')


def test_a_signed_publish_that_cannot_write_leaves_nothing(tmp_path: Path) -> None:
    """A file-size limit below the signature's size (the disk is full, as far as the writer knows):
    the signature and the manifest are staged together, so neither lands and no temporary file stays."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = tmp_path / "key.pem"
    key.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    folder = write_checkpoint(tmp_path / "ckpt")
    before = snapshot(folder)

    def small_files() -> None:  # EFBIG instead of SIGXFSZ past 2,000 bytes (a signature is ~3 kB)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))

    result = subprocess.run(
        [sys.executable, "-m", "ckptpub", "publish", "--sign", str(key), str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=small_files,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("ckptpub: error: model.sig: cannot write in "), result.stderr
    assert "File too large" in result.stderr
    assert snapshot(folder) == before  # no manifest, no signature, no temporary file, mtime kept
