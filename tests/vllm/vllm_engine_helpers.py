"""Helpers for the vLLM tests: the engine runner subprocess and shared constants.

(A module of its own because ``conftest`` is not importable by name under
``--import-mode=importlib``; this folder is on pytest's ``pythonpath``, see pyproject.toml.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
TAMPERED_TENSOR = "model.norm.weight"
SHIM = HERE.parents[1] / "tests" / "daemon_sim"
#: The CPU shim for vLLM's real weight-cache daemon (tests/daemon_sim/sitecustomize.py), on PYTHONPATH
#: on purpose: Python's `site` imports a `sitecustomize` found there in every process, including the
#: daemon children `vllm preload` spawns (see the shim's docstring).
SHIM_ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(SHIM), os.environ.get("PYTHONPATH")]))}
#: The engines' settings (run_engine.py) that enter vLLM's weight-cache key: a daemon must match them.
DAEMON_ARGS = ["--dtype", "float32", "--max-model-len", "128", "--enforce-eager"]
#: What every test engine of the tiny Qwen3 runs with: small, eager, deterministic.
TINY_ENGINE = {
    "dtype": "float32",
    "max_model_len": 128,
    "enforce_eager": True,
    "max_num_seqs": 2,
    "kv_cache_memory_bytes": 64 << 20,
    "seed": 0,
}


def same_size_edit(path: str, old: bytes, new: bytes) -> None:
    """Replace ``old`` by ``new`` (of the same length) once in the file at ``path``."""
    with open(path, "rb") as f:
        data = f.read()
    assert old in data
    assert len(old) == len(new)
    with open(path, "wb") as f:
        f.write(data.replace(old, new, 1))


def run_engines(jobs: list[dict], env: dict | None = None, timeout: int = 600) -> tuple[list[dict], str]:
    """Run ``run_engine.py`` on ``jobs``; return the parsed results and the full log."""
    proc = subprocess.run(
        [sys.executable, str(HERE / "run_engine.py"), json.dumps(jobs)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    log = proc.stdout + proc.stderr
    results = [
        json.loads(line.split(" ", 1)[1])
        for line in proc.stdout.splitlines()
        if line.startswith("CKPTPUB_RESULT ")
    ]
    assert len(results) == len(jobs), f"runner failed (rc {proc.returncode}):\n{log[-4000:]}"
    return results, log
