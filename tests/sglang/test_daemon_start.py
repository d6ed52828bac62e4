"""SGLang's weight-cache daemons get the plugin however they start: ``python -m ckptpub_sglang.daemon``, and
the daemons an engine spawns (``spawn_weight_cache_daemon``, replaced). On this CPU a daemon cannot load
(SGLang's daemon needs CUDA): what is shown is that the plugin is loaded, and checked, before that."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.checkpoints import write_checkpoint

import ckptpub

NOT_LOADED = "ckptpub: the ckptpub SGLang plugin is not loaded in this weight-cache daemon"


def launch(model: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ckptpub_sglang.daemon", "--model-path", str(model), "--gpu-id", "0"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def test_the_launcher_loads_the_plugin_and_refuses_to_start_without_it(tmp_path: Path) -> None:
    model = write_checkpoint(tmp_path / "model")
    ckptpub.publish(str(model))
    without = launch(model, {**os.environ, "SGLANG_PLUGINS": "none"})  # SGLang's own plugin filter
    assert without.returncode == 2
    assert without.stderr.strip().splitlines()[-1].startswith(NOT_LOADED)

    loaded = launch(model, dict(os.environ))
    assert NOT_LOADED not in loaded.stderr  # past the plugin: on to SGLang's daemon, which needs a GPU here
    assert loaded.returncode != 0


def test_an_engine_spawns_its_daemons_through_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.weight_cache import daemon

    monkeypatch.setenv("SGLANG_PLUGINS", "none")  # the child, a fresh interpreter, inherits it
    # the name SGLang's engine calls (``--weight-cache-mode daemon``), replaced by the plugin's ``spawn``
    child = daemon.spawn_weight_cache_daemon(None, gpu_id=0, tp_rank=0, pp_rank=0, dist_init_method="")
    child.join(120)
    assert child.exitcode == 2  # the plugin's check ran in the child, before SGLang's daemon
