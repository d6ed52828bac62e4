"""Helpers for the tests that run vLLM engines (tests/vllm, tests/signing): the engine runner subprocess
(``tests/vllm/run_engine.py``), the OpenAI server, the weight-cache daemon's CPU shim, shared constants.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).parents[1]
#: The engine runner: ``python run_engine.py JOBS_JSON``.
RUN_ENGINE = TESTS / "vllm" / "run_engine.py"
TAMPERED_TENSOR = "model.norm.weight"
#: Engine loads of the ``toggled`` checkpoint while a writer changes its bytes under them.
TOGGLED_LOADS = 4
SHIM = TESTS / "daemon_sim"
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


def hub_env(hub_home: dict[str, str]) -> dict[str, str]:
    """The environment of an engine serving hub ids from the tests' cache (``hub_home``), offline: vLLM
    then hands the loader the snapshot path; folders given as paths are unaffected."""
    return {"HF_HOME": hub_home["home"], "HF_HUB_OFFLINE": "1"}


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
        [sys.executable, str(RUN_ENGINE), json.dumps(jobs)],
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
                [sys.executable, str(RUN_ENGINE), json.dumps(jobs)],
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


@contextlib.contextmanager
def api_server(args: list[str], log_path: Path, env: dict | None = None) -> Iterator[str]:
    """``python -m vllm.entrypoints.openai.api_server ARGS`` with the tiny engine's settings, on a free
    port; yields its URL once ``/health`` answers, and stops it afterwards (its output in ``log_path``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    command += engine_flags(TINY_ENGINE)  # the offline engines' settings, as flags
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, log_path.read_text()[-6000:]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, log_path.read_text()[-6000:]
                time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def post(url: str, body: dict) -> tuple[int, dict | str]:
    """POST ``body`` as JSON; the status and the decoded answer (its text when it is not JSON)."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            text = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as error:
        text, status = error.read().decode(), error.code
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def complete(url: str, model: str, prompt: str = "the quick brown fox") -> tuple[int, dict | str]:
    """A greedy completion of 8 tokens, with the token ids in the answer."""
    body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0.0, "return_token_ids": True}
    return post(f"{url}/v1/completions", body)


def completion_tokens(answer: tuple[int, dict | str]) -> list[int]:
    status, body = answer
    assert status == 200, answer
    assert isinstance(body, dict)
    return body["choices"][0]["token_ids"]
