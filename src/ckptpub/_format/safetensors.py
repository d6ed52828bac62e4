"""A strict, header-only safetensors parser that never trusts a number it read.

ckptpub hashes tensors by the byte ranges a shard's header declares, so the header
must describe the file exactly: every tensor's size equals its shape times its
dtype's width, tensors tile the data region with no overlap, hole or trailing
byte, and every length is bounded before anything is allocated for it. This module
parses header bytes; reading them from a file (the 8-byte length prefix and the
header, never tensor data) is ``_filesystem.model_files.read_layout``; a whole file
already in memory is ``layout_in_memory``. Standard library only.
"""

from __future__ import annotations

import operator
import struct
from itertools import repeat
from math import prod
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple

from ..errors import CkptpubError
from .strict_json import loads_strict, loads_two_level

#: The safetensors reference implementation refuses headers above 100 MB; so do we.
MAX_HEADER_BYTES = 100_000_000

#: Width in bits of each dtype the safetensors format defines.
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}


class TensorSlice(NamedTuple):
    """One tensor as a shard's header declares it; offsets are relative to the data region."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


class ShardLayout(NamedTuple):
    """Where a shard's header ends and which tensors tile its data region, in file order."""

    header_size: int
    tensors: tuple[TensorSlice, ...]


def header_length(prefix: bytes, file_size: int, display_name: str) -> int:
    """The header length a file's 8-byte prefix declares, once it fits the limit and the file."""
    (length,) = struct.unpack("<Q", prefix)
    if length > MAX_HEADER_BYTES:
        raise CkptpubError(
            f"{display_name}: safetensors header length {length} exceeds the {MAX_HEADER_BYTES}-byte limit"
        )
    if 8 + length > file_size:
        raise CkptpubError(
            f"{display_name}: safetensors header length {length} "
            f"runs past the end of the file ({file_size} bytes)"
        )
    return int(length)


def layout_in_memory(data: bytes | bytearray | memoryview, display_name: str) -> ShardLayout:
    """The layout of a whole safetensors file held in memory: the length prefix, then ``parse_header``."""
    if len(data) < 8:
        raise CkptpubError(
            f"{display_name}: truncated safetensors file ({len(data)} bytes, no header length)"
        )
    length = header_length(bytes(data[:8]), len(data), display_name)
    return parse_header(bytes(data[8 : 8 + length]), len(data), display_name)


def parse_header(header: bytes, file_size: int, display_name: str) -> ShardLayout:
    """Validate header bytes (without the length prefix) against the size of their file."""
    header_size = 8 + len(header)
    document: Any = loads_two_level(header) or loads_strict(header, display_name, "safetensors header")
    if not isinstance(document, dict):
        raise CkptpubError(f"{display_name}: safetensors header is not a JSON object")
    metadata = document.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise CkptpubError(f"{display_name}: __metadata__ must map strings to strings")
    tensors = _parse_tensors_at_once(document) or [
        _parse_tensor(name, entry, display_name) for name, entry in document.items()
    ]
    tensors.sort(key=_BY_OFFSETS)
    data_size = file_size - header_size
    begins, ends = list(map(_BEGIN, tensors)), list(map(_END, tensors))
    if begins[:1] not in ([], [0]) or begins[1:] != ends[:-1]:  # each begins where the one before ends
        raise CkptpubError(f"{display_name}: {_first_gap(tensors)}")
    position = ends[-1] if ends else 0
    if position > data_size:
        raise CkptpubError(
            f"{display_name}: tensors end at data offset {position}, "
            f"past the end of the file (data region is {data_size} bytes)"
        )
    if position < data_size:
        raise CkptpubError(f"{display_name}: {data_size - position} bytes after the last tensor")
    return ShardLayout(header_size=header_size, tensors=tuple(tensors))


def _first_gap(tensors: list[TensorSlice]) -> str:
    """What is wrong where the first tensor (in offset order) does not begin where the one before ends."""
    position = 0
    for tensor in tensors:
        if tensor.begin != position:
            problem = (
                "overlaps the tensor before it" if tensor.begin < position else "leaves a hole before it"
            )
            return f"tensor {tensor.name!r} at offset {tensor.begin} {problem}"
        position = tensor.end
    return "tensors do not tile the data region"


_BY_OFFSETS = attrgetter("begin", "end")
_BEGIN, _END = attrgetter("begin"), attrgetter("end")
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})


def _parse_tensors_at_once(document: dict[str, Any]) -> list[TensorSlice] | None:
    """The tensors of a well-formed header, checked column by column; None if any rule might fail.

    A 100k-tensor checkpoint's headers hold 100k entries: checking them with whole-column
    operations (``map``, ``set``) instead of a Python call per tensor is most of what keeps
    ``publish`` under a second. Whenever a check fails here, ``_parse_tensor`` runs on
    every entry to name the first bad one; it refuses exactly what this refuses.
    """
    entries = list(document.values())
    if "" in document or not set(map(type, entries)) <= {dict}:
        return None
    if not all(map(operator.eq, map(dict.keys, entries), repeat(_ENTRY_KEYS))):
        return None
    dtypes = list(map(itemgetter("dtype"), entries))
    shapes = list(map(itemgetter("shape"), entries))
    offsets = list(map(itemgetter("data_offsets"), entries))
    if not set(map(type, dtypes)) <= {str} or not set(dtypes) <= DTYPE_BITS.keys():
        return None
    if set(map(type, shapes)) - {list} or set(map(type, offsets)) - {list}:
        return None
    if set(map(len, offsets)) - {2}:
        return None
    begins, ends = list(map(itemgetter(0), offsets)), list(map(itemgetter(1), offsets))
    shape_tuples = list(map(tuple, shapes))
    dims = [d for shape in set(shape_tuples) for d in shape] + begins + ends
    if set(map(type, dims)) - {int} or (dims and (min(dims) < 0 or max(dims) >= 2**63)):
        return None
    sizes = {}
    for key in set(zip(dtypes, shape_tuples, strict=True)):
        bits = prod(key[1]) * DTYPE_BITS[key[0]]
        if bits % 8:
            return None
        sizes[key] = bits // 8
    if list(map(sizes.__getitem__, zip(dtypes, shape_tuples, strict=True))) != list(
        map(operator.sub, ends, begins)
    ):
        return None
    rows = zip(document, dtypes, shape_tuples, begins, ends, strict=True)
    return list(map(tuple.__new__, repeat(TensorSlice), rows))  # TensorSlice._make, without a call per row


def _parse_tensor(name: str, entry: object, display_name: str) -> TensorSlice:
    where = f"{display_name}: tensor {name!r}"
    if not name:
        raise CkptpubError(f"{display_name}: a tensor has an empty name")
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise CkptpubError(f"{where} must have exactly dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:  # a list or an object cannot be looked up
        raise CkptpubError(f"{where} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise CkptpubError(f"{where} has an invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise CkptpubError(f"{where} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    if end < begin:
        raise CkptpubError(f"{where} has data_offsets that end before they begin")
    bits = prod(shape) * DTYPE_BITS[dtype]
    if bits % 8 or bits // 8 != end - begin:
        raise CkptpubError(
            f"{where}: shape {shape} of {dtype} needs {bits / 8:g} bytes but data_offsets span {end - begin}"
        )
    return TensorSlice(name=name, dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def _is_count(value: object) -> bool:
    return type(value) is int and 0 <= value < 2**63
