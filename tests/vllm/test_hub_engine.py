"""Serving a model of the Hugging Face cache by its hub id through ``manifest_cache``.

The cache (``hub_home``: v1's files as three models) is built offline and resolved by
huggingface_hub and vLLM themselves (``HF_HOME``, ``HF_HUB_OFFLINE=1``). The offline
engines run in the session's one engine runner (``engine_results``); the OpenAI server
is a process of its own. Nothing of vLLM is mocked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.vllm_engine_helpers import TAMPERED_TENSOR, api_server, complete, completion_tokens, hub_env

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
