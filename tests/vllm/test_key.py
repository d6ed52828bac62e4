"""vLLM's weight-cache key with the plugin: the manifest identity, read from one file.

Real vLLM code throughout: ``WeightCacheKey.from_model_config`` on ``ModelConfig``s
built by ``EngineArgs`` for checkpoints of 12 safetensors shards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import ckptpub_vllm
import pytest
from ckptpub_vllm.shared.key import original_hash_checkpoint

import ckptpub
from ckptpub.serving import RefusedError

_recording: list[str] | None = None


def _audit(event, args):
    if _recording is not None and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        _recording.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


def opened_during(fn, *args):
    global _recording
    _recording = []
    try:
        result = fn(*args)
        return result, list(_recording)
    finally:
        _recording = None


def model_config(folder):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=folder, dtype="float32", max_model_len=128, enforce_eager=True
    ).create_model_config()


def key_of(folder):
    from vllm.model_executor.model_loader.weight_cache.protocol import WeightCacheKey

    config = model_config(folder)  # config parsing may read headers; only the key is audited
    return opened_during(lambda: WeightCacheKey.from_model_config(config, tp_size=1, tp_rank=0))


@pytest.fixture(scope="module", autouse=True)
def plugin():
    ckptpub_vllm.register()
    ckptpub_vllm.register()  # idempotent


def test_key_is_manifest_identity_and_opens_only_the_manifest(models):
    shards = [n for n in os.listdir(models["v1"]) if n.endswith(".safetensors")]
    assert len(shards) >= 8
    key, opened = key_of(models["v1"])
    assert key.checkpoint == ckptpub.read_manifest(models["v1"]).identity
    inside = [p for p in opened if os.path.dirname(os.path.abspath(p)) == os.path.abspath(models["v1"])]
    assert [os.path.basename(p) for p in inside] == [ckptpub.MANIFEST_NAME], opened
    assert not any(p.endswith(".safetensors") for p in opened)


def test_same_layout_different_values_get_different_keys(models):
    # vLLM's own fingerprint cannot tell them apart: this is the bug being fixed.
    stock = original_hash_checkpoint()
    stock_v1, opened = opened_during(stock, models["v1"])
    assert stock_v1 == stock(models["republished"])
    assert sum(p.endswith(".safetensors") for p in opened) >= 8  # the audit hook does see shard opens
    key_v1, _ = key_of(models["v1"])
    key_re, _ = key_of(models["republished"])
    assert key_v1.checkpoint != key_re.checkpoint
    assert key_v1.mismatched_fields(key_re) == ["checkpoint"]


def test_without_manifest_vllm_key_is_kept(models):
    key, _ = key_of(models["nomanifest"])
    assert key.checkpoint == original_hash_checkpoint()(models["nomanifest"])


@pytest.mark.parametrize(
    ("value", "refusal"),
    [
        ("1", "no ckptpub.json"),
        ("on", "no ckptpub.json"),  # the core's flag words, as for every CKPTPUB_* flag
        ("maybe", "CKPTPUB_REQUIRE_MANIFEST: 'maybe' is neither on"),  # fail closed, not "off"
    ],
)
def test_fail_closed_on_missing_manifest_when_asked(models, monkeypatch, value, refusal):
    monkeypatch.setenv("CKPTPUB_REQUIRE_MANIFEST", value)
    with pytest.raises(RefusedError, match=refusal) as raised:
        key_of(models["nomanifest"])
    assert "\n" not in str(raised.value)


def test_invalid_manifest_is_an_error_not_a_fallback(models, tmp_path):
    folder = shutil.copytree(models["v1"], tmp_path / "broken")
    path = folder / ckptpub.MANIFEST_NAME
    path.write_bytes(
        path.read_bytes().replace(b'"identity":"blake3:', b'"identity":"blake3:0', 1)[:-70] + b"\n"
    )
    with pytest.raises(RefusedError, match="unusable"):
        key_of(str(folder))


@pytest.mark.parametrize(
    "make",
    [
        lambda p: p.mkdir(),
        lambda p: p.symlink_to("no-such-file"),
        lambda p: p.symlink_to(p.parent),
        lambda p: p.symlink_to("/etc/hostname"),
    ],
    ids=["folder", "dangling symlink", "symlink to a folder", "symlink out of the folder"],
)
def test_a_manifest_path_that_is_not_a_plain_file_is_refused_not_absent(models, tmp_path, make):
    folder = shutil.copytree(models["nomanifest"], tmp_path / "odd")
    make(folder / ckptpub.MANIFEST_NAME)
    with pytest.raises(RefusedError, match="ckptpub.json is unusable"):
        key_of(str(folder))


def test_the_loader_hands_the_key_the_manifest_it_checked(models, tmp_path):
    from ckptpub_vllm.shared.key import checked

    folder = str(shutil.copytree(models["v1"], tmp_path / "handed"))
    checked_manifest = ckptpub.read_manifest(folder)
    shutil.copy(
        os.path.join(models["republished"], ckptpub.MANIFEST_NAME),
        os.path.join(folder, ckptpub.MANIFEST_NAME),
    )
    with checked(
        folder, checked_manifest
    ):  # another manifest landed after the check: the key keeps the checked one
        key, opened = key_of(folder)
    assert key.checkpoint == checked_manifest.identity
    assert not any(p.endswith(ckptpub.MANIFEST_NAME) for p in opened)
    key, _ = key_of(folder)  # outside the block the file is read again
    assert key.checkpoint == ckptpub.read_manifest(models["republished"]).identity


@pytest.fixture
def hub_constants(hub_home, monkeypatch):
    """huggingface_hub in this process, pointed at the tests' cache as ``HF_HOME`` would at import."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", os.path.join(hub_home["home"], "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_the_weight_cache_key_of_a_hub_id_is_its_identity_read_from_one_small_file(hub_home, hub_constants):
    """Engines and daemons build the key with this one function: the daemon is keyed by the identity."""
    from ckptpub_vllm.shared.key import checkpoint_key

    snapshot = hub_home["acme/tiny-qwen3"]
    identity = ckptpub.read_manifest(snapshot).identity
    key, opened = key_of("acme/tiny-qwen3")  # vLLM resolves the id offline, then keys the snapshot path
    assert key.checkpoint == identity
    assert [p for p in opened if p.startswith(hub_home["home"])] == [os.path.join(snapshot, "ckptpub.json")]
    by_id, opened = opened_during(checkpoint_key, "acme/tiny-qwen3")  # as an online vLLM hands it: the id
    assert by_id == identity
    repository = os.path.dirname(os.path.dirname(snapshot))
    in_cache = [os.path.relpath(p, repository) for p in opened if p.startswith(hub_home["home"])]
    # ckptpub reads the ref (checked), huggingface_hub looks for its tree listing, then the manifest
    assert in_cache[-1] == os.path.join("snapshots", os.path.basename(snapshot), "ckptpub.json"), in_cache
    assert all(p.startswith(("refs/", "trees/")) for p in in_cache[:-1]), in_cache
    assert not any(p.endswith(".safetensors") for p in opened), opened


def test_a_local_folder_is_keyed_without_importing_vllm(models, tmp_path):
    """Only a folder under a ``model_streamer`` folder can be vLLM's pulled copy, so a process that has
    not loaded vLLM (the preload tests' stand-in daemon) computes a folder's key without it. A folder of
    that name elsewhere is keyed by its manifest."""
    elsewhere = tmp_path / "model_streamer" / "0123abcd"
    shutil.copytree(models["v1"], elsewhere)
    program = (
        "import sys; from ckptpub_vllm.shared.key import checkpoint_key; "
        f"print(checkpoint_key({str(models['v1'])!r}), 'vllm' in sys.modules, 'torch' in sys.modules); "
        f"print(checkpoint_key({str(elsewhere)!r}))"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    identity = ckptpub.read_manifest(models["v1"]).identity
    assert result.stdout.split("\n")[:2] == [f"{identity} False False", identity]
