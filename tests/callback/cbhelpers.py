"""Helpers of the callback tests alone: the CLI, manifests as dicts, each rank's report.

The tests import it as ``tests.callback.cbhelpers``; the training scripts of this folder that they
start import it by its bare name (a script's own folder is first on its ``sys.path``). Helpers other
folders use too are in ``tests/support``: the tiny model (``tiny_model``), torchrun commands and
checkpoint listings (``runs``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import ckptpub


def cli_command() -> list[str]:
    """The ckptpub CLI: the console script beside this Python, else ``python -m ckptpub``."""
    script = Path(sys.executable).with_name("ckptpub")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ckptpub"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(cli_command() + list(args), capture_output=True, text=True, timeout=120)


def assert_verifies(folder: str | os.PathLike) -> None:
    r = run_cli("verify", str(folder))
    assert r.returncode == 0, f"ckptpub verify {folder}: rc={r.returncode}\n{r.stdout}\n{r.stderr}"


def manifest_json(folder: str | os.PathLike) -> dict:
    """The manifest's fields, with its tensor records as dicts in place of its two regions of entries."""
    document = json.loads((Path(folder) / "ckptpub.json").read_bytes())
    del document["model"], document["layout"]
    document["tensors"] = [t._asdict() for t in ckptpub.read_manifest(folder).tensors]
    return document


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
