"""Serving a model of the Hugging Face cache by its hub id through ``manifest_cache``.

The cache (``hub_home``: v1's files as four models) is built offline and resolved by
huggingface_hub and vLLM themselves (``HF_HOME``, ``HF_HUB_OFFLINE=1``). The offline
engines run in the session's one engine runner (``engine_results``); the OpenAI server
is a process of its own. Nothing of vLLM is mocked.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from support.hf_cache import SilentHub
from support.vllm_engine_helpers import (
    TAMPERED_TENSOR,
    api_server,
    complete,
    completion_tokens,
    hub_env,
    run_engines,
)

import ckptpub

pytestmark = pytest.mark.slow  # vLLM engines and the OpenAI server

REPO = "acme/tiny-qwen3"


def test_an_engine_serves_a_published_cached_model_by_hub_id_as_auto_does(engine_results, hub_home):
    results, log = engine_results
    auto, ours = results["hub_auto"], results["hub_manifest"]
    assert "tokens" in ours, ours
    assert ours["tokens"] == auto["tokens"] == results["v1_auto"]["tokens"]
    snapshot = hub_home[REPO]
    identity = ckptpub.read_manifest(snapshot).identity
    assert f"ckptpub: requested {snapshot}, identity {identity}" in log  # the snapshot vLLM resolved
    assert f"of {snapshot} from disk" in log


def test_a_tampered_blob_is_refused_by_tensor_name(engine_results, hub_home):
    error = engine_results[0]["hub_tampered"].get("error", "")
    folder = hub_home["acme/tampered"]
    assert f"ckptpub: refusing to serve {folder}: tensor '{TAMPERED_TENSOR}'" in error, error
    assert "differs from the manifest" in error


def test_an_unpublished_cached_model_is_refused_with_the_command_that_publishes_it(engine_results, hub_home):
    error = engine_results[0]["hub_unpublished"].get("error", "")
    commit = Path(hub_home["acme/unpublished"]).name
    assert "no ckptpub.json" in error, error
    assert f"publish it with `ckptpub publish acme/unpublished --revision {commit}`" in error, error


def test_the_openai_server_serves_a_hub_id_verified(engine_results, hub_home, tmp_path):
    args = ["--model", REPO, "--load-format", "manifest_cache"]
    with api_server(args, tmp_path / "server.log", env=hub_env(hub_home)) as url:
        tokens = completion_tokens(complete(url, REPO))
    assert tokens == engine_results[0]["hub_auto"]["tokens"][0][:8]  # greedy: the offline engine's start
    log = (tmp_path / "server.log").read_text()
    identity = ckptpub.read_manifest(hub_home[REPO]).identity
    assert "ckptpub: loaded and verified 25 of 25 tensors" in log
    assert f"identity {identity}" in log


def test_an_id_not_in_the_cache_is_refused_with_the_commands_to_run(engine_results, hub_home):
    """vLLM resolves the id before any loader runs (``EngineArgs.__post_init__``); the plugin resolves it
    first, so the engine ends in ckptpub's one line, not huggingface_hub's LocalEntryNotFoundError. Any
    other load format keeps vLLM's own error."""
    error = engine_results[0]["hub_absent"].get("error", "")
    cache = os.path.join(hub_home["home"], "hub")
    assert error.startswith(
        f"RefusedError: ckptpub: refusing to serve acme/absent: no snapshot of the model acme/absent in the "
        f"Hugging Face cache {cache} (HF_HUB_CACHE; nothing is downloaded); download it with "
        f"`hf download acme/absent`, then publish it with `ckptpub publish acme/absent`"
    ), error
    assert "LocalEntryNotFoundError" in engine_results[0]["hub_absent_auto"].get("error", "")


def test_a_ref_that_is_not_a_commit_is_refused_not_followed(engine_results, hub_home):
    error = engine_results[0]["hub_badref"].get("error", "")
    ref = os.path.join(os.path.dirname(os.path.dirname(hub_home["acme/badref"])), "refs", "main")
    assert f"ckptpub: refusing to serve acme/badref: {ref}: holds '../../models--acme--tiny-qwen3/" in error
    assert "not a commit hash (40 hex digits); not followed" in error


def test_without_hf_hub_offline_an_engine_asks_no_hub_about_a_cached_id(engine_results, hub_home):
    """``HF_HUB_OFFLINE=0`` and a hub that accepts connections and never answers: vLLM's own config lookup
    would wait minutes on it; the plugin hands vLLM the snapshot first, so the id is served (and an id not
    in the cache refused) without a single connection."""
    hub = SilentHub()
    jobs = [
        {"model": "acme/tiny-qwen3", "load_format": "manifest_cache"},
        {"model": "acme/absent", "load_format": "manifest_cache"},
    ]
    started = time.monotonic()
    try:
        env = {"HF_HOME": hub_home["home"], "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub.url}
        (served, absent), _ = run_engines(jobs, env=env, timeout=300)
        assert hub.connections == []
    finally:
        hub.close()
    assert time.monotonic() - started < 200
    assert served.get("tokens") == engine_results[0]["hub_auto"]["tokens"], served
    assert "ckptpub: refusing to serve acme/absent: no snapshot of the model acme/absent" in absent.get(
        "error", ""
    )
