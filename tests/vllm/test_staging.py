"""The reused buffers of a verified load (``worker.staging``): reused only once nothing else holds them.

Each test holds a copy the way something real would (vLLM's loop variable, a view vLLM
narrowed, a parameter set to the tensor, a hash still reading it) and checks that its
bytes are never overwritten, and that a copy nobody holds is reused.
"""

from __future__ import annotations

import time

import pytest
import torch
from ckptpub_vllm.worker.staging import StagingBuffers, storage_holders
from ckptpub_vllm.worker.verify_stream import TensorVerifier, raw_bytes
from support.safetensors_files import stream_tensors

import ckptpub
from ckptpub.serving import INLINE_HASH_BYTES

LARGE = (INLINE_HASH_BYTES // 4) * 2  # float32 elements of a tensor above the inline size


def _tensor(fill: float, count: int = LARGE) -> torch.Tensor:
    return torch.full((count,), fill, dtype=torch.float32)


def test_a_copy_nobody_holds_is_reused_and_holds_the_new_bytes():
    staging = StagingBuffers(keep_bytes=1 << 30)
    first = staging.copy_of(_tensor(1.0))
    address = first.data_ptr()
    del first
    second = staging.copy_of(_tensor(2.0))
    assert (staging.allocated, staging.reused) == (1, 1)
    assert second.data_ptr() == address
    assert torch.equal(second, _tensor(2.0))


@pytest.mark.parametrize(
    "hold",
    [
        lambda copy: copy,  # vLLM's loop variable, or a loader that keeps the tensor
        lambda copy: copy.narrow(0, 8, 16),  # a tensor-parallel rank's slice of it
        lambda copy: torch.nn.Parameter(copy, requires_grad=False),  # a parameter set to it, not copied
        raw_bytes,  # the memoryview a pending hash reads
    ],
    ids=["the tensor", "a view", "a parameter", "a pending hash"],
)
def test_a_copy_still_held_is_never_overwritten(hold):
    staging = StagingBuffers(keep_bytes=1 << 30)
    held = hold(staging.copy_of(_tensor(1.0)))
    before = bytes(held) if isinstance(held, memoryview) else held.clone()
    other = staging.copy_of(_tensor(2.0))
    assert (staging.allocated, staging.reused) == (2, 0)
    assert torch.equal(other, _tensor(2.0))
    if isinstance(held, memoryview):
        assert bytes(held) == before
    else:
        assert torch.equal(held, before)


def test_only_this_pool_holds_a_buffer_between_loans():
    staging = StagingBuffers(keep_bytes=1 << 30)
    copy = staging.copy_of(_tensor(1.0))
    assert storage_holders(copy) > 1  # the pool's buffer and the copy handed out
    del copy
    staging.copy_of(_tensor(3.0, LARGE * 2))  # another size: the first buffer goes back to the free list
    assert [storage_holders(buffer) for buffer in staging._free] == [1]


def test_free_buffers_are_kept_within_their_bound_and_all_let_go_at_release():
    size = _tensor(0.0).nbytes
    staging = StagingBuffers(keep_bytes=2 * size)
    copies = [staging.copy_of(_tensor(float(n))) for n in range(4)]
    del copies
    staging.copy_of(_tensor(9.0, LARGE * 2))
    assert len(staging._free) == 2
    assert staging._free_bytes == 2 * size
    staging.release()
    assert staging._free == []
    assert staging._lent == []


def test_small_and_accelerator_tensors_are_not_pooled():
    staging = StagingBuffers(keep_bytes=1 << 30)
    small = torch.ones(INLINE_HASH_BYTES // 4, dtype=torch.float32)
    copy = staging.copy_of(small)
    assert copy.data_ptr() != small.data_ptr()
    assert torch.equal(copy, small)
    meta = torch.empty(LARGE, device="meta")  # stands in for a GPU tensor: none on this machine
    assert staging.copy_of(meta) is meta
    assert staging.allocated == 0


def test_a_strided_tensor_is_copied_contiguous():
    staging = StagingBuffers(keep_bytes=1 << 30)
    base = torch.arange(LARGE, dtype=torch.float32).reshape(-1, 64)
    copy = staging.copy_of(base.T)
    assert copy.is_contiguous()
    assert torch.equal(copy, base.T)


@pytest.mark.parametrize("keep", [True, False], ids=["a loader that keeps every tensor", "a copying loader"])
def test_a_verified_stream_hands_out_the_published_bytes_whatever_the_loader_holds(models, keep):
    """The loader either copies each tensor and drops it (buffers are reused), or keeps every
    tensor to the end (no buffer may be reused): at the end each tensor it got hashes to the manifest.

    A buffer is reused only once its hash is done, so the copying loader waits for that (as a
    loader slower than the hashing does) before it takes the next tensor: otherwise how many
    buffers are reused depends on how busy the machine's cores are.
    """
    folder = models["v1"]
    manifest = ckptpub.read_manifest(folder)
    verifier = TensorVerifier(folder, manifest)
    got: dict[str, torch.Tensor] = {}
    for name, tensor in verifier.wrap(stream_tensors(folder)):
        got[name] = tensor if keep else tensor.clone()
        if not keep:
            _wait_until_only_the_pool_holds(tensor)
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


def _wait_until_only_the_pool_holds(tensor: torch.Tensor, limit_s: float = 60.0) -> None:
    """Wait until ``tensor``'s memory has no more holders than a copy the pool just made (hashed)."""
    pool = StagingBuffers(keep_bytes=0)
    settled = storage_holders(pool.copy_of(tensor))
    deadline = time.monotonic() + limit_s
    while storage_holders(tensor) > settled:
        assert time.monotonic() < deadline, "the hash of a tensor never let go of its copy"
        time.sleep(0.001)
