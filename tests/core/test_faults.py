"""Fault injection with real processes: kills, a full disk, files changing under the hasher, racing
publishers.

Each test states the invariant: the folder ends with no manifest or a complete one
that verifies, never a partial one, and bad outcomes are one-line errors.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.checkpoints import run_cli, snapshot, sparse_shard, write_checkpoint

import ckptpub

KILL_TRIALS = 40
RACE_TRIALS = 8


def publish_command(folder: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ckptpub", "publish", *extra, str(folder)]


def test_sigkill_during_publish_never_leaves_a_partial_manifest(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt")
    sparse_shard(folder / "big.safetensors", tensors=8, tensor_bytes=32 << 20)
    start = time.perf_counter()
    assert subprocess.run(publish_command(folder, "--threads", "1"), capture_output=True).returncode == 0
    duration = time.perf_counter() - start
    (folder / "ckptpub.json").unlink()
    rng = random.Random(1234)
    outcomes = {"no manifest": 0, "complete manifest": 0}
    for _ in range(KILL_TRIALS):
        process = subprocess.Popen(
            publish_command(folder, "--threads", "1"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(rng.uniform(0, duration * 1.1))
        process.send_signal(signal.SIGKILL)
        process.wait()
        manifest = folder / "ckptpub.json"
        if manifest.exists():
            assert ckptpub.verify(folder).ok  # parses, validates and matches the bytes
            outcomes["complete manifest"] += 1
            manifest.unlink()
        else:
            outcomes["no manifest"] += 1
    print(f"SIGKILL during publish: {KILL_TRIALS} trials, {outcomes}")
    assert sum(outcomes.values()) == KILL_TRIALS
    leftovers = [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
    if leftovers:  # a kill between create and rename leaves a temp file, which verify ignores
        assert run_cli("publish", folder).returncode == 0
        assert run_cli("verify", folder).returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root (CI runs as root)")
def test_disk_full_while_writing_the_manifest(tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        folder = write_checkpoint(mount / "ckpt", extra_files=False)
        filler = mount / "filler"
        with open(
            filler, "wb", buffering=0
        ) as handle:  # fill the rest of the file system, outside the folder
            try:
                while True:
                    handle.write(b"\0" * 4096)
            except OSError:
                pass
        before = snapshot(folder)
        result = run_cli("publish", folder)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert "No space left on device" in result.stderr, result.stderr
        assert snapshot(folder) == before, "no manifest, no temp file, folder mtime restored"
        filler.unlink()
        assert run_cli("publish", folder).returncode == 0
        assert run_cli("verify", folder).returncode == 0
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_file_changed_while_hashed_is_refused(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt")
    sparse_shard(
        folder / "big.safetensors", tensors=16, tensor_bytes=64 << 20
    )  # 1 GiB, a second or more with pread on one thread
    process = subprocess.Popen(
        publish_command(folder, "--threads", "1", "--no-mmap"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_until_open(
        process.pid, folder / "big.safetensors"
    )  # scanned and being hashed: not before, not after
    with open(folder / "big.safetensors", "r+b") as handle:  # an in-place write, as a late writer would do
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x01")
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 2, stderr
    assert stderr.strip() == (
        "ckptpub: error: big.safetensors: changed while it was being hashed; "
        "publish again once it is complete"
    )
    assert not (folder / "ckptpub.json").exists()


def _wait_until_open(pid: int, path: Path, timeout: float = 60.0) -> None:
    """Return once process ``pid`` holds ``path`` open (read from /proc, so no sleep has to guess)."""
    deadline = time.monotonic() + timeout
    target = str(path.resolve())
    while time.monotonic() < deadline:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            raise AssertionError("publish exited before it opened the file") from None
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return
            except OSError:
                continue
        time.sleep(0.002)
    raise AssertionError(f"publish did not open {path} within {timeout} s")


def test_racing_publishers_leave_a_manifest_that_verifies(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt", shards=2)
    sparse_shard(folder / "big.safetensors", tensors=4, tensor_bytes=16 << 20)
    identities = set()
    for _ in range(RACE_TRIALS):
        racers = [
            subprocess.Popen(
                publish_command(folder), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        results = [(p.communicate(timeout=120), p.returncode) for p in racers]
        assert [code for _, code in results] == [0, 0], results
        identities |= {out.strip() for (out, _), _ in results}
        assert ckptpub.verify(folder).ok
        assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert len(identities) == 1
    print(f"racing publishers: {RACE_TRIALS} trials of 2 processes, all verified")


def test_folder_deleted_while_publishing_is_a_clean_error(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt")
    sparse_shard(folder / "big.safetensors", tensors=16, tensor_bytes=64 << 20)
    process = subprocess.Popen(
        publish_command(folder, "--threads", "1", "--no-mmap"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.15)
    shutil.rmtree(folder)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 2, stderr
    assert stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr, stderr
    assert not folder.exists()
