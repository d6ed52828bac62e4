"""A verified vLLM stream's private copies (``ckptpub.serving_torch.StagingBuffers``): the published
bytes whatever the loader holds, in reused memory when it lets go."""

from __future__ import annotations

import pytest
import torch
from ckptpub_vllm.worker.verify_stream import TensorVerifier
from support.safetensors_files import stream_tensors
from support.staging import wait_until_only_the_pool_holds

import ckptpub
from ckptpub.serving_torch import raw_bytes


@pytest.mark.parametrize("keep", [True, False], ids=["a loader that keeps every tensor", "a copying loader"])
def test_a_verified_stream_hands_out_the_published_bytes_whatever_the_loader_holds(models, keep):
    """The loader either copies each tensor and drops it (buffers are reused), or keeps every
    tensor to the end (no buffer may be reused): at the end each tensor it got hashes to the manifest.
    The copying loader waits for each hash before it takes the next tensor (``support.staging``)."""
    folder = models["v1"]
    manifest = ckptpub.read_manifest(folder)
    verifier = TensorVerifier(folder, manifest)
    got: dict[str, torch.Tensor] = {}
    for name, tensor in verifier.wrap(stream_tensors(folder)):
        got[name] = tensor if keep else tensor.clone()
        if not keep:
            wait_until_only_the_pool_holds(tensor)
    staging = verifier._staging
    counts = (staging.allocated, staging.reused)
    verifier.finish()
    expected = manifest.model()
    assert set(got) == set(expected)
    for name, tensor in got.items():
        assert ckptpub.tensor_digest(raw_bytes(tensor)) == expected[name].digest, name
    if keep:
        assert counts[1] == 0
        assert counts[0] > 0
    else:
        assert counts[1] > counts[0] > 0
