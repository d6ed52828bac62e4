"""Ctrl-C during publish, for real: SIGINT at random moments of a running ``ckptpub publish``.

Each trial starts the CLI on a folder whose hashing takes a while and waits until
the process has opened a file of the folder (so the signal lands in publish, not in
the interpreter's start-up). Half the trials then send SIGINT within 50 ms
(while hashing); the other half wait for the manifest's temporary file to
appear and send it then (while writing; when the write wins the race, publish ends
normally). The outcome must be exit 130 with the one line ``ckptpub: error:
interrupted`` (or exit 0 when publish had finished), never a traceback, never a
temporary file left, and any manifest there must verify.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from checkpoints import run_cli, sparse_shard, write_checkpoint

TRIALS = 16


def sigint_as_at_a_terminal() -> None:
    """In the child: SIGINT at its default, so Python turns it into KeyboardInterrupt.

    A test run started in the background (``cmd &``, ``nohup``) inherits SIGINT ignored, and
    ckptpub rightly keeps it ignored (``nohup ckptpub publish`` must not stop on Ctrl-C).
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def opened_a_file_in(pid: int, folder: Path) -> bool:
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return False
    return any(link.startswith(str(folder) + os.sep) for link in links)


def test_sigint_during_publish(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt")
    # zeros in a hole: free to store, and slow enough to hash (about 1.1 GiB) that a signal sent
    # within 50 ms of the first open lands while hashing even on a loaded machine
    sparse_shard(folder / "big.safetensors", 12, 96 << 20)
    (folder / "model.safetensors.index.json").unlink(missing_ok=True)
    assert run_cli("publish", folder).returncode == 0
    rng = random.Random(11)
    outcomes = {0: 0, 130: 0}
    for trial in range(TRIALS):
        (folder / "ckptpub.json").unlink(missing_ok=True)
        process = subprocess.Popen(
            [sys.executable, "-m", "ckptpub", "publish", str(folder)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
            preexec_fn=sigint_as_at_a_terminal,
        )
        deadline = time.monotonic() + 30
        while not opened_a_file_in(process.pid, folder) and process.poll() is None:
            assert time.monotonic() < deadline, "publish never opened a file of the folder"
            time.sleep(0.001)
        if trial % 2:
            while process.poll() is None and not any(p.name.endswith(".tmp") for p in folder.iterdir()):
                time.sleep(0.0002)
        else:
            time.sleep(rng.uniform(0, 0.05))
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
        assert "Traceback" not in stderr, (trial, stderr)
        assert process.returncode in outcomes, (trial, process.returncode, stderr)
        outcomes[process.returncode] += 1
        if process.returncode == 130:
            assert stderr == "ckptpub: error: interrupted\n", (trial, stderr)
        leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".ckptpub.json.")]
        assert leftovers == [], (trial, leftovers)
        if (folder / "ckptpub.json").exists():
            assert run_cli("verify", folder).returncode == 0, trial
    print(f"SIGINT trials: {TRIALS}, interrupted {outcomes[130]}, finished first {outcomes[0]}")
    assert outcomes[130] >= 1  # the signals did land during publishing
