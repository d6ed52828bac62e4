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
#: Engine loads of the ``toggled`` checkpoint while a writer changes its bytes under them.
TOGGLED_LOADS = 4
SHIM = HERE.parents[1] / "tests" / "daemon_sim"
# the shim goes on PYTHONPATH on purpose: Python's `site` imports a `sitecustomize` found there in every
# process, including the daemon children `vllm preload` spawns (see the shim's docstring)
SHIM_ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(SHIM), os.environ.get("PYTHONPATH")]))}
#: What every test engine of the tiny Qwen3 runs with: small, eager, deterministic.
TINY_ENGINE = {
    "dtype": "float32",
    "max_model_len": 128,
    "enforce_eager": True,
    "max_num_seqs": 2,
    "kv_cache_memory_bytes": 64 << 20,
    "seed": 0,
}


def engine_flags(settings: dict) -> list[str]:
    """Engine settings (``LLM(**settings)``) as the command-line flags of ``vllm serve``/``vllm preload``."""
    flags: list[str] = []
    for option, value in settings.items():
        flags += [f"--{option.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return flags


# the engines' settings that enter vLLM's weight-cache key: the daemon must match them
DAEMON_ARGS = engine_flags({k: TINY_ENGINE[k] for k in ("dtype", "max_model_len", "enforce_eager")})


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


class EngineRunner:
    """``run_engine.py`` running beside the test, its output in a file: the test acts between its jobs
    (``{"wait_for": PATH}``) and reads what the engines did so far."""

    def __init__(self, jobs: list[dict], log_path: Path, env: dict | None = None) -> None:
        self.jobs, self.log_path = jobs, log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "run_engine.py"), json.dumps(jobs)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def results(self) -> list[dict]:
        return [
            json.loads(line.split(" ", 1)[1])
            for line in self.log().splitlines()
            if line.startswith("CKPTPUB_RESULT ")
        ]

    def finish(self, timeout: int = 900) -> tuple[list[dict], str]:
        """Wait for every job; the results and each job's own log lines (the text before its result)."""
        self.proc.wait(timeout=timeout)
        results, log = self.results(), self.log()
        assert len(results) == len(self.jobs), f"runner failed (rc {self.proc.returncode}):\n{log[-4000:]}"
        return results, log

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
