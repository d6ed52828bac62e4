"""SGLang's own disk loader (``DefaultModelLoader._get_weights_iterator``, the weight cache's fallback, a
daemon's load and an engine without the cache) verified tensor by tensor on CPU by the plugin's hook."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.checkpoints import flip_byte, locate, model_tensors, write_checkpoint
from support.staging import wait_until_only_the_pool_holds

import ckptpub
from ckptpub.serving import RefusedError


def stream(folder: Path, load_format: str = "safetensors") -> dict[str, Any]:
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader

    loader = DefaultModelLoader(LoadConfig(load_format=load_format))
    return dict(loader._get_weights_iterator(DefaultModelLoader.Source(str(folder), None)))


@pytest.fixture
def published(tmp_path: Path) -> Path:
    folder = write_checkpoint(tmp_path / "step-1000", shards=2)
    ckptpub.publish(str(folder))
    return folder


@pytest.mark.parametrize("load_format", ["safetensors", "auto"])
def test_the_published_tensors_stream_unchanged(published: Path, load_format: str) -> None:
    loaded = stream(published, load_format)
    expected = model_tensors()
    assert sorted(loaded) == sorted(expected)
    for name, array in expected.items():
        assert np.array_equal(loaded[name].numpy(), array), name


def test_a_tampered_shard_is_refused_by_tensor_name(published: Path) -> None:
    shard, start, _ = locate(published, "model.layers.1.mlp.up_proj.weight")
    flip_byte(shard, start + 5)
    with pytest.raises(RefusedError, match=r"tensor 'model\.layers\.1\.mlp\.up_proj\.weight' differs"):
        stream(published)


def test_a_pinned_identity_refuses_another_checkpoint(
    published: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = write_checkpoint(tmp_path / "step-1200", model_tensors(seed=1200))
    ckptpub.publish(str(other))
    identity = ckptpub.read_manifest(str(published)).identity
    monkeypatch.setenv("CKPTPUB_EXPECT_IDENTITY", identity)
    assert sorted(stream(published)) == sorted(model_tensors())
    with pytest.raises(RefusedError, match=f"is not the expected {identity}"):
        stream(other)


def test_a_folder_without_a_manifest_loads_unverified_unless_one_is_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = write_checkpoint(tmp_path / "plain")
    assert sorted(stream(plain)) == sorted(model_tensors())
    monkeypatch.setenv("CKPTPUB_REQUIRE_MANIFEST", "1")
    with pytest.raises(RefusedError, match=r"no ckptpub\.json"):
        stream(plain)


def test_a_loader_that_copies_each_tensor_gets_the_published_bytes_in_reused_memory(tmp_path: Path) -> None:
    """SGLang's weight loaders copy each tensor into its parameter and let go of it: the private copies
    the plugin hands out (over SGLang's own shard iterator) then take turns in a few buffers, and each
    holds the published bytes. Each hash is waited for (``support.staging``), as a loader slower than
    the hashing would."""
    from ckptpub_sglang.loader import TensorVerifier
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    rng = np.random.default_rng(7)
    layers = {
        f"model.layers.{n}.mlp.up_proj.weight": rng.standard_normal((256, 128), np.float32) for n in range(8)
    }
    folder = write_checkpoint(tmp_path / "larger", layers, shards=2)
    ckptpub.publish(str(folder))
    manifest = ckptpub.read_manifest(str(folder))
    verifier = TensorVerifier(str(folder), manifest)
    copied = {}
    for name, tensor in verifier.stream(
        safetensors_weights_iterator([str(folder / s) for s in manifest.weights])
    ):
        copied[name] = tensor.numpy().copy()
        wait_until_only_the_pool_holds(tensor)
    assert sorted(copied) == sorted(layers)
    for name, array in layers.items():
        assert np.array_equal(copied[name], array), name
    assert verifier.staging.reused > verifier.staging.allocated > 0
