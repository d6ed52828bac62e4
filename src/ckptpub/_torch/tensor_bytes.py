"""A torch tensor as the manifest sees it: its safetensors dtype code and its bytes as stored.

Both engines' loaders yield torch tensors; ``StreamVerifier`` takes a dtype code and bytes.
The manifest records safetensors' codes (``BF16``, ``F8_E4M3``), so a tensor's dtype is
named by the code its shard stores, and its bytes are the contiguous bytes of that dtype.
"""

from __future__ import annotations

import ctypes

import torch

from .._serving.stream import INLINE_HASH_BYTES, Bytes

_DTYPE_CODES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
for _name, _code in (  # dtypes an older torch may lack
    ("uint16", "U16"),
    ("uint32", "U32"),
    ("uint64", "U64"),
    ("float8_e4m3fn", "F8_E4M3"),
    ("float8_e5m2", "F8_E5M2"),
    ("float8_e8m0fnu", "F8_E8M0"),
):
    if hasattr(torch, _name):
        _DTYPE_CODES[getattr(torch, _name)] = _code

_TORCH_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}


def dtype_code(dtype: torch.dtype) -> str:
    """The safetensors code of a torch dtype (what the manifest records); torch's own name when
    safetensors has none, which no manifest entry matches."""
    return _DTYPE_CODES.get(dtype, str(dtype).removeprefix("torch."))


def torch_dtype(code: str) -> torch.dtype | None:
    """The torch dtype of a safetensors dtype code, or None when torch has none (``F4``, ``C64``...)."""
    return _TORCH_DTYPES.get(code)


def raw_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes as stored (a zero-copy view for contiguous CPU tensors)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def small_bytes(tensor: torch.Tensor) -> bytes:
    """A copy of a small tensor's bytes, made without ``raw_bytes``' five intermediate objects.

    A mixture of experts streams tens of thousands of tensors of a few KiB; for them the
    detach, reshape, view, array and memoryview cost three times the hash itself. A
    contiguous CPU tensor's bytes lie at ``data_ptr()``, ``nbytes`` long: copied out in
    one call while the caller holds the tensor.
    """
    if tensor.is_cpu and tensor.is_contiguous():
        return ctypes.string_at(tensor.data_ptr(), tensor.nbytes)
    return bytes(raw_bytes(tensor))


def tensor_bytes(tensor: torch.Tensor) -> Bytes:
    """What ``StreamVerifier.hash`` takes for ``tensor``: a copy of a small one (hashed at once on
    the loading thread), a view of a large one's memory (hashed on the pool while the view holds it)."""
    return small_bytes(tensor) if tensor.nbytes <= INLINE_HASH_BYTES else raw_bytes(tensor)
