"""``ckptpub.serving_torch``: a tensor as the manifest names it, and the reused buffers of a verified load.

The buffer tests hold a copy the way something real would (an engine's loop variable, a view
it narrowed, a parameter set to the tensor, a hash still reading it) and check that its bytes
are never overwritten, and that a copy nobody holds is reused.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load, save

from ckptpub.serving import INLINE_HASH_BYTES
from ckptpub.serving_torch import (
    StagingBuffers,
    dtype_code,
    raw_bytes,
    storage_holders,
    tensor_bytes,
    torch_dtype,
)

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
        lambda copy: copy,  # the engine's loop variable, or a loader that keeps the tensor
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


def test_a_tensor_s_bytes_are_its_bytes_as_stored():
    """The copy a small tensor's bytes are hashed from (made from ``data_ptr()``) holds what the
    zero-copy view of a large one does, for a slice, a transposed (non-contiguous) tensor, a 0-d
    tensor and several dtype widths."""
    small = torch.arange(96, dtype=torch.float32).reshape(8, 12)
    large = torch.arange(LARGE, dtype=torch.float32).reshape(-1, 64)
    for base in (small, large):
        for tensor in (base, base[2:5], base.T, base.to(torch.bfloat16), base[3, 4], base.to(torch.int8)[1]):
            expected = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            assert bytes(tensor_bytes(tensor)) == bytes(raw_bytes(tensor)) == expected, tensor


@pytest.mark.parametrize(
    "dtype",
    [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16]
    + [torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2],
)
def test_a_dtype_is_named_by_the_code_safetensors_stores_and_back(dtype):
    """The code is read from a file safetensors itself wrote, not from a second table."""
    data = save({"t": torch.zeros(2, dtype=dtype)})
    header_size = int.from_bytes(data[:8], "little")
    code = json.loads(data[8 : 8 + header_size])["t"]["dtype"]
    assert dtype_code(dtype) == code
    assert torch_dtype(code) is dtype
    assert load(data)["t"].dtype is dtype


def test_a_dtype_safetensors_cannot_store_has_no_code_a_manifest_could_hold():
    assert dtype_code(torch.complex64) == "complex64"
    assert torch_dtype("C64") is None
