"""vLLM's REAL weight-cache daemon across a format upgrade: a folder published as ckptpub/2 while the
daemon holds it, published again as /3. The supervisor keeps the daemon; an engine maps it.

Real and simulated parts as in test_real_daemon.py (the CPU shim stands in for CUDA IPC
and the device UUID only). The daemon computes its key once, so it keeps the /2
identity; an engine reading the /3 manifest asks by the /3 identity, is answered with a
mismatch on ``checkpoint``, and asks again by its model's /2 identity. Proved by
tokens: the engine serves a copy whose disk bytes differ (one tensor zeroed, the /3
manifest kept) and generates the daemon's tokens.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from support.checkpoints import publish_in_format
from support.preload_helpers import SupervisorProc, ready_with, wait_for
from support.vllm_engine_helpers import DAEMON_ARGS, SHIM_ENV, TAMPERED_TENSOR, run_engines

import ckptpub

pytestmark = pytest.mark.slow  # the weight-cache daemon and vLLM engines


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory):
    from support.safetensors_files import copy_with_zeroed_tensor
    from support.tiny_model import build_tiny_qwen3

    root = tmp_path_factory.mktemp("migration")
    folder = root / "model"
    build_tiny_qwen3(str(folder))
    old = publish_in_format(folder, "ckptpub/2")
    state = Path(tempfile.mkdtemp(prefix="ckmg", dir="/tmp"))  # vLLM's socket path must fit AF_UNIX
    sup = SupervisorProc(
        root,
        [str(folder)],
        env=SHIM_ENV,
        state_dir=state,
        daemon_cmd=None,
        extra_opts=["--interval", "0.5", "--ready-timeout", "300", "--retry-delay", "600"],
        passthrough=DAEMON_ARGS,
    )
    sup.start()
    try:
        wait_for(
            ready_with(sup, old.identity), timeout=400, what="the daemon holding the /2 identity", proc=sup
        )
        new = ckptpub.publish(folder)
        kept = wait_for(
            lambda: [e for e in sup.decisions() if e.get("why") == "same-model-new-format"],
            timeout=120,
            what="the supervisor's decision on the /3 manifest",
            proc=sup,
        )
        tampered = copy_with_zeroed_tensor(str(folder), str(root / "tampered"), TAMPERED_TENSOR)
        socket = {"socket_dir": sup.status()["socket_dir"]}
        jobs = [
            {"model": str(folder), "load_format": "auto", "extra": {}},
            {"model": tampered, "load_format": "manifest_cache", "extra": {**socket, "fallback": False}},
        ]
        results, log = run_engines(jobs, env=SHIM_ENV, timeout=900)
        yield {
            "old": old,
            "new": new,
            "kept": kept,
            "status": sup.status(),
            "launched": [e for e in sup.decisions() if e.get("why") == "launched"],
            "disk": results[0],
            "mapped": {**results[1], "log": log.split("CKPTPUB_RESULT ")[1]},
        }
        assert sup.terminate(timeout=120) == 0
    finally:
        sup.cleanup()
        shutil.rmtree(state, ignore_errors=True)


def test_the_supervisor_keeps_the_daemon_and_is_ready(migrated) -> None:
    old, new, status = migrated["old"], migrated["new"], migrated["status"]
    assert old.version == "ckptpub/2"
    assert new.version == "ckptpub/3"
    assert new.identity != old.identity
    assert [(e["action"], e["target"]["identity"]) for e in migrated["kept"]] == [("keep", new.identity)]
    assert len(migrated["launched"]) == 1  # no re-preload
    assert status["state"] == "ready"
    assert (status["held"]["identity"], status["target"]["identity"]) == (old.identity, new.identity)


def test_an_engine_on_the_republished_folder_maps_the_daemon(migrated) -> None:
    mapped, disk = migrated["mapped"], migrated["disk"]
    assert mapped.get("tokens") == disk["tokens"], (mapped.get("error"), mapped["log"][-3000:])
    assert "mismatch on fields: ['checkpoint']" in mapped["log"]
    assert f"older-format identity {migrated['old'].identity}: mapping its weights" in mapped["log"]
    assert "tensors from the weight cache daemon" in mapped["log"]
    assert "loaded and verified" not in mapped["log"]  # not from disk (whose bytes generate other tokens)
