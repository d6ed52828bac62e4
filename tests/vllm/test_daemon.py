"""The daemon side: vLLM's own ``WeightCacheDaemon`` agrees on the manifest key.

Here the daemon's request handling is driven in-process over a socket pair, with CPU
tensors (which ``TensorEntry`` ships by value), to check each answer of the protocol
one by one; only ``get_current_device_uuid`` is replaced: it needs a GPU.
``test_real_daemon.py`` runs the whole daemon, started by ``ckptpub preload``, behind
the CPU shim of ``tests/daemon_sim``. The spawn test checks what ``vllm preload``'s
children get: the plugin's wrapper, importable in a fresh interpreter that loads no
plugins. (The ``cache_config`` attribute used here is vLLM 0.32's; 0.33 renames it.)
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import subprocess
import sys

import ckptpub_vllm
import pytest
import torch
from ckptpub_vllm import daemon as plugin_daemon
from ckptpub_vllm.shared import daemon_reports
from support.vllm_engine_helpers import DAEMON_ARGS, SHIM_ENV

import ckptpub


@pytest.fixture(scope="module", autouse=True)
def plugin():
    ckptpub_vllm.register()
    plugin_daemon.install(force=True)


def engine_config(folder):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=folder, dtype="float32", max_model_len=128, enforce_eager=True, kv_cache_memory_bytes=64 << 20
    ).create_engine_config()


def ask(daemon, key):
    from vllm.model_executor.model_loader.weight_cache.protocol import recv_msg, send_msg

    client, server = socket.socketpair()
    with client, server:
        send_msg(client, {"cmd": "get_state", "cache_config": key})
        daemon._handle_connection(server)
        return recv_msg(client)


def test_daemon_answers_ok_for_the_identity_and_mismatch_for_another(models, monkeypatch):
    from vllm.model_executor.model_loader.weight_cache import daemon as vllm_daemon
    from vllm.model_executor.model_loader.weight_cache.protocol import WeightCacheKey

    monkeypatch.setattr(vllm_daemon, "get_current_device_uuid", lambda: "cpu-test")  # needs a GPU
    d = vllm_daemon.WeightCacheDaemon(engine_config(models["v1"]), 0, 0, "tcp://127.0.0.1:1")
    assert d.cache_config.checkpoint == ckptpub.read_manifest(models["v1"]).identity
    d.model = torch.nn.Linear(4, 2)  # what it holds; CPU tensors travel by value

    same = WeightCacheKey.from_model_config(engine_config(models["v1"]).model_config, tp_size=1, tp_rank=0)
    reply = ask(d, same)
    assert reply["status"] == "ok"
    assert set(reply["entries"]) == {"weight", "bias"}

    other = WeightCacheKey.from_model_config(
        engine_config(models["republished"]).model_config, tp_size=1, tp_rank=0
    )
    reply = ask(d, other)
    assert reply == {"status": "mismatch", "fields": ["checkpoint"]}


def test_preload_spawns_the_plugin_wrapper(models, tmp_path):
    from vllm.model_executor.model_loader.weight_cache import daemon as vllm_daemon

    assert vllm_daemon._run_daemon is plugin_daemon.run_daemon
    blob = tmp_path / "target.pkl"
    blob.write_bytes(
        pickle.dumps((vllm_daemon._run_daemon, (0, 0, engine_config(models["v1"]), "tcp://x", None, None)))
    )
    child = f"""
import json, pickle, sys
from vllm.model_executor.model_loader.weight_cache import daemon, protocol
assert not hasattr(protocol.hash_checkpoint, "_ckptpub_original"), "plugin already loaded"
seen = {{}}
def gpu_free_body(global_rank, local_rank, vllm_config, *rest):  # vLLM's body needs CUDA
    key = protocol.WeightCacheKey.from_model_config(vllm_config.model_config, tp_size=1, tp_rank=0)
    seen.update(checkpoint=key.checkpoint, load_format=vllm_config.load_config.load_format)
daemon._run_daemon = gpu_free_body
target, args = pickle.loads(open({str(blob)!r}, "rb").read())
assert target.__module__ == "ckptpub_vllm.daemon"
target(*args)
print("SEEN " + json.dumps(seen))
"""
    env = {**os.environ, "VLLM_PLUGINS": "none"}
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("SEEN ")]
    assert lines, proc.stdout + proc.stderr
    seen = json.loads(lines[0][5:])
    assert seen == {
        "checkpoint": ckptpub.read_manifest(models["v1"]).identity,
        "load_format": "manifest_cache",
    }


def test_entry_point_wraps_the_daemon_where_daemons_are_launched():
    """Through the real entry point: the ``vllm`` CLI process (which imports the
    ``preload`` command before loading plugins) gets the wrapper. (Engine processes,
    which import no ``preload``, skip it: see ``daemon.install``.)"""
    code = """
import sys
{pre}
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.model_executor import model_loader
from vllm.model_executor.model_loader.weight_cache import protocol
assert model_loader._LOAD_FORMAT_TO_MODEL_LOADER["manifest_cache"].__name__ == "ManifestCacheLoader"
assert hasattr(protocol.hash_checkpoint, "_ckptpub_original")
name = "vllm.model_executor.model_loader.weight_cache.daemon"
print("WRAPPED", sys.modules[name]._run_daemon.__module__ if name in sys.modules else "not-imported")
"""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    for pre, expected in (("import vllm.entrypoints.cli.preload", "ckptpub_vllm.daemon"),):
        proc = subprocess.run(
            [sys.executable, "-c", code.format(pre=pre)], capture_output=True, text=True, env=env, timeout=300
        )
        assert f"WRAPPED {expected}" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_engine_loader_and_daemon_over_a_real_socket(models, tmp_path, monkeypatch):
    """The plugin's loader asks vLLM's daemon (``serve_forever`` on a Unix socket, in a
    thread, holding CPU tensors) for v1: the daemon maps for v1's key and answers a
    mismatch on ``checkpoint`` for the same-layout republished copy."""
    import threading

    from ckptpub_vllm.worker.loader import ManifestCacheLoader
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader.weight_cache import daemon as vllm_daemon
    from vllm.model_executor.model_loader.weight_cache import ipc_loader
    from vllm.model_executor.model_loader.weight_cache.protocol import (
        CacheConfigMismatchError,
        WeightCacheKey,
    )

    for module in (vllm_daemon, ipc_loader):  # device UUIDs need a GPU
        monkeypatch.setattr(module, "get_current_device_uuid", lambda: "cpu-test")
    import tempfile

    socket_dir = tempfile.mkdtemp(prefix="ckv-", dir="/tmp")  # AF_UNIX paths are short
    d = vllm_daemon.WeightCacheDaemon(
        engine_config(models["v1"]), 0, 0, "tcp://127.0.0.1:1", socket_dir=socket_dir
    )
    d.model = torch.nn.Linear(4, 2)
    ready = threading.Event()
    threading.Thread(target=d.serve_forever, kwargs={"ready_callback": ready.set}, daemon=True).start()
    assert ready.wait(30)

    loader = ManifestCacheLoader(
        LoadConfig(load_format="manifest_cache", model_loader_extra_config={"socket_dir": socket_dir})
    )
    key_v1 = WeightCacheKey.from_model_config(engine_config(models["v1"]).model_config, tp_size=1, tp_rank=0)
    state = loader._request_state(key_v1)
    assert set(state.entries) == {"weight", "bias"}
    assert torch.equal(state.entries["weight"].rebuild(0), d.model.weight)

    key_re = WeightCacheKey.from_model_config(
        engine_config(models["republished"]).model_config, tp_size=1, tp_rank=0
    )
    with pytest.raises(CacheConfigMismatchError, match="checkpoint"):
        loader._request_state(key_re)
    shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.mark.slow  # vLLM's own `vllm preload` and its daemon child, behind the CPU shim
@pytest.mark.parametrize(
    ("load_format", "extra", "what"),
    [
        ("runai_streamer", None, "--load-format runai_streamer"),
        ("auto", {"enable_multithread_load": True}, "--load-format auto with --model-loader-extra-config"),
    ],
    ids=["another loader", "auto with extra config"],
)
def test_a_daemon_keyed_by_the_identity_never_loads_through_an_unverifying_loader(
    models, tmp_path, load_format, extra, what
):
    """Issue 32 item 1, a fail-open: such a daemon kept vLLM's own loader while its key was the manifest's
    identity, so unverified bytes were held, and handed to engines, as the published model.

    vLLM's real daemon (``vllm preload`` through ckptpub's launcher; only CUDA IPC and the device
    simulated, ``tests/daemon_sim``) refuses in one line before it loads or keys anything.
    """
    command = [sys.executable, "-m", "ckptpub_vllm.preload.vllm_launcher", "preload", "--model", models["v1"]]
    command += ["--load-format", load_format, *DAEMON_ARGS]
    if extra is not None:
        command += ["--model-loader-extra-config", json.dumps(extra)]
    env = {**os.environ, **SHIM_ENV, "TMPDIR": str(tmp_path)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    refusal = (
        f"ckptpub: refusing to serve {models['v1']}: a weight-cache daemon keyed by its manifest's identity "
        f"loads only through a verifying loader, and {what} does not verify; start it with --load-format "
        "manifest_cache (its options in --model-loader-extra-config)"
    )
    assert [line for line in output.splitlines() if line.endswith(refusal)], output[-3000:]
    reports = [daemon_reports.parse(line) for line in output.splitlines()]
    assert not [r for r in reports if r is not None], output[-3000:]  # neither keyed nor loaded
