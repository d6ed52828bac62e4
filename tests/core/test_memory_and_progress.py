"""The process's own memory stays small whatever the checkpoint size; the progress bar shows on a terminal
only."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import blake3
import pytest
from support.checkpoints import sparse_shard

from ckptpub._cli.progress import ProgressBar

SHARD_TENSORS = 16  # two 1 GiB shards of 64 MiB zero tensors, written sparse so the test costs no disk


@pytest.fixture(scope="module")
def big_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("big")
    for index in range(2):
        sparse_shard(folder / f"model-{index}.safetensors", SHARD_TENSORS, 64 << 20)
    (folder / "config.json").write_text("{}")
    return folder


def peak_anonymous_kib(command: list[str]) -> tuple[int, subprocess.CompletedProcess]:
    """Run ``command``, sampling /proc/PID/status RssAnon (memory it owns, not mapped file pages)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while process.poll() is None:
        try:
            with open(f"/proc/{process.pid}/status") as status:
                for line in status:
                    if line.startswith("RssAnon:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            break
        time.sleep(0.005)
    stdout, stderr = process.communicate()
    return peak, subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.mark.parametrize("mode", [[], ["--no-mmap"]], ids=["mmap", "pread"])
def test_anonymous_memory_stays_under_256_mib(big_checkpoint: Path, mode: list[str]) -> None:
    for verb in ("publish", "verify"):
        peak, result = peak_anonymous_kib([sys.executable, "-m", "ckptpub", verb, *mode, str(big_checkpoint)])
        assert result.returncode == 0, result.stderr
        assert 0 < peak < 256 * 1024, f"{verb} {mode}: peak RssAnon {peak} KiB"


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_on_a_terminal_after_a_delay() -> None:
    terminal = FakeTerminal()
    bar = ProgressBar("hashing", terminal)
    bar(10, 100)
    assert terminal.getvalue() == "", "nothing is drawn for work that finishes quickly"
    bar.started -= 1.0
    bar(50, 100)
    assert terminal.getvalue().startswith("\rhashing [###############...............]  50%")
    bar.close()
    assert terminal.getvalue().endswith("\r\x1b[K")


def test_progress_bar_silent_when_not_a_terminal(big_checkpoint: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ckptpub", "verify", "--threads", "1", str(big_checkpoint)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0
    assert "\r" not in result.stderr
    assert result.stderr.count("\n") == 1


def seconds_of_hashing(tmp_path: Path, seconds: float) -> Path:
    """A published sparse checkpoint that one thread hashes in about ``seconds`` on this machine.

    BLAKE3 runs at 2-10 GB/s on one core depending on AVX-512, so the size is measured, not fixed.
    """
    sample = bytes(256 << 20)
    start = time.perf_counter()
    blake3.blake3(sample).digest()
    rate = len(sample) / (time.perf_counter() - start)
    tensors = max(16, int(seconds * rate) // (64 << 20))
    folder = tmp_path / "slow"
    folder.mkdir()
    sparse_shard(folder / "model.safetensors", tensors, 64 << 20)
    (folder / "config.json").write_text("{}")
    published = subprocess.run([sys.executable, "-m", "ckptpub", "publish", str(folder)], capture_output=True)
    assert published.returncode == 0, published.stderr
    return folder


def test_progress_bar_on_a_real_terminal(tmp_path: Path) -> None:
    """Through a pseudo-terminal, as a user at a shell sees it: 2 s of hashing, the bar shows after 0.5 s."""
    import pty

    folder = seconds_of_hashing(tmp_path, 2.0)
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "ckptpub", "verify", "--threads", "1", "--no-mmap", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=follower,
    )
    os.close(follower)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: _drain(leader, chunks), daemon=True)
    reader.start()
    assert process.wait(timeout=120) == 0
    reader.join(timeout=5)
    output = b"".join(chunks).decode(errors="replace")
    assert "verifying [" in output, output
    assert "GB/s" in output, output


def _drain(fd: int, chunks: list[bytes]) -> None:
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:
            return
        if not data:
            return
        chunks.append(data)
