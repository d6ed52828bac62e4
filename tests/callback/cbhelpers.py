"""Helpers for the callback tests: the CLI, folder listings (the tiny model is ``support.tiny_model``).

Lives in its own module (not conftest.py) so test files can import it by a name no
other test folder uses (this folder is on pytest's ``pythonpath``, see pyproject.toml).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import ckptpub

# for this process and the training scripts the tests start
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def cli_command() -> list[str]:
    """The ckptpub CLI: the console script beside this Python, else ``python -m ckptpub``."""
    script = Path(sys.executable).with_name("ckptpub")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ckptpub"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(cli_command() + list(args), capture_output=True, text=True, timeout=120)


def assert_verifies(folder: str | os.PathLike) -> None:
    r = run_cli("verify", str(folder))
    assert r.returncode == 0, f"ckptpub verify {folder}: rc={r.returncode}\n{r.stdout}\n{r.stderr}"


def checkpoints(run_dir: str | os.PathLike) -> list[str]:
    """Checkpoint folder names in a run, by step."""
    names = [p.name for p in Path(run_dir).glob("checkpoint-*") if p.is_dir()]
    return sorted(names, key=lambda n: int(n.rsplit("-", 1)[1]))


def manifest_json(folder: str | os.PathLike) -> dict:
    """The manifest's fields, with its tensor records as dicts in place of its two regions of entries."""
    document = json.loads((Path(folder) / "ckptpub.json").read_bytes())
    del document["model"], document["layout"]
    document["tensors"] = [t._asdict() for t in ckptpub.read_manifest(folder).tensors]
    return document


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


def write_rank_report(out: str | os.PathLike, trainer, callback, **extra) -> None:
    """What this rank of a torchrun job published, as OUT/rank-{rank}.json, for the test to read."""
    rank = int(os.environ.get("RANK", "0"))
    report = {
        "rank": rank,
        "world_size": trainer.args.world_size,
        "should_save": trainer.args.should_save,
        "published": [p.step for p in callback.published],
        "ranks": [p.ranks for p in callback.published],
        "failures": callback.failures,
        **extra,
    }
    Path(out, f"rank-{rank}.json").write_text(json.dumps(report))
