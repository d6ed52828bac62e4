"""Training runs the tests start and read: torchrun commands, process groups, the checkpoints saved.

Shared by the callback tests (Trainer, torchrun and FSDP runs), the signing tests and the
vLLM tests that start ranks with torchrun.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def checkpoints(run_dir: str | os.PathLike) -> list[str]:
    """Checkpoint folder names in a run, by step."""
    names = [p.name for p in Path(run_dir).glob("checkpoint-*") if p.is_dir()]
    return sorted(names, key=lambda n: int(n.rsplit("-", 1)[1]))


def run_group(cmd: list[str], *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own process group; on timeout kill that group (torchrun's
    workers too) instead of leaving orphans that hold the cores."""
    import signal

    proc = subprocess.Popen(
        cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {cmd}\n{out[-2000:]}\n{err[-2000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1, for torchrun's rendezvous (port 0 hangs)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(ranks: int, *args: str) -> list[str]:
    """``torchrun --nproc_per_node RANKS ARGS...`` on this machine, on a free port."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(ranks),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        *args,
    ]
