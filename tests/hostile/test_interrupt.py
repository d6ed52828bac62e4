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

from support.checkpoints import run_cli, sparse_shard, write_checkpoint

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


#: Runs the CLI as ``python -m ckptpub`` does, sending itself SIGINT when the N-th module is
#: imported (``sys.argv[1]``; the ``import`` audit event fires as each module is loaded).
_INTERRUPT_AT_IMPORT = """
import os, signal, sys
from ckptpub.console import main  # what the console script and ``python -m ckptpub`` import first
target, loaded = int(sys.argv[1]), 0
def interrupt_at_the_target(event, args):
    global loaded
    if event == "import":
        loaded += 1
        if loaded == target:
            os.kill(os.getpid(), signal.SIGINT)
sys.addaudithook(interrupt_at_the_target)
sys.argv = ["ckptpub", *sys.argv[2:]]
main()
"""


def test_sigint_while_the_cli_is_still_importing(tmp_path: Path) -> None:
    """A real SIGINT while the CLI imports its modules (at evenly spread points of the ~110 imports
    of ``ckptpub verify``, and of the ~630 of ``verify --public-key``, model_signing among them):
    exit 130 and one line, never a ``KeyboardInterrupt`` traceback from an import."""
    folder = write_checkpoint(tmp_path / "ckpt")
    assert run_cli("publish", folder).returncode == 0
    key = tmp_path / "key.pub"
    key.write_text("not a key")  # refused, but only after model_signing is imported
    trials = [(n, ["verify", str(folder)]) for n in range(1, 90, 8)]
    trials += [(n, ["verify", "--public-key", str(key), str(folder)]) for n in range(100, 560, 100)]
    for target, args in trials:
        result = subprocess.run(
            [sys.executable, "-c", _INTERRUPT_AT_IMPORT, str(target), *args],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            preexec_fn=sigint_as_at_a_terminal,
        )
        assert (result.returncode, result.stderr) == (130, "ckptpub: error: interrupted\n"), (
            target,
            args[:2],
            result.returncode,
            result.stderr[-2000:],
        )
    print(f"SIGINT at {len(trials)} import points: exit 130 and one line each")


def test_import_ckptpub_imports_nothing_until_a_name_is_used() -> None:
    """What lies outside the CLI's Ctrl-C handling is only ``import ckptpub`` and ``ckptpub.console``."""
    program = (
        "import sys, ckptpub.console; before = sorted(m for m in sys.modules if m.startswith('ckptpub'));"
        "ckptpub.publish; print(before, 'ckptpub._operations.publishing' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    loaded_first, publish_loaded = result.stdout.split("] ")
    assert loaded_first == "['ckptpub', 'ckptpub._version', 'ckptpub.console'", result.stderr
    assert publish_loaded == "True\n"
