"""ckptpub/3's two regions: every tensor as one JSON array on a line of its own, inside one JSON document.

A ``ckptpub/3`` manifest is a single JSON document (``docs/format.md``) whose bytes
are laid out exactly: a first line with the small fields (and the byte size of each
region), then the two arrays below, one entry a line, so a reader finds each region
by its size without parsing anything in it:

* the *model region*: one entry ``["name","DTYPE",[d0,d1],"<64 hex>"]`` per tensor of
  the weight files, sorted by name. The identity commits to its bytes, so an engine's
  key is one BLAKE3 pass over them and no per-tensor work;
* the *layout region*: each safetensors file's tensors in offset order (the order of
  ``files``, ``tensors`` entries per file). A weight file's entry is ``["name"]`` (its
  dtype, shape and digest are in the model region); another file's entry has the four
  model-region fields. Offsets are not stored (``records.place``).

Entries are canonical JSON joined by ``,\\n``: one byte form per region, which
``decode_regions`` checks (and every other rule) before returning records. The
decoding is whole-region work in C (``json``, ``map``, ``zip``), not a Python call per
tensor, so 100k tensors decode in a few tenths of a second.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Sequence
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple, Protocol

from .errors import CkptpubError
from .hashing import DIGEST_PREFIX
from .records import (
    Columns,
    Fail,
    FileRecord,
    ModelEntry,
    TensorRecord,
    assemble,
    failure_in,
    model_entries,
    parts,
)
from .safetensors import DTYPE_BITS
from .strict_json import loads_strict

#: Between the model region and the layout region, and after the layout region: the document's glue.
BETWEEN = b'\n],"layout":[\n'
END = b"\n]}\n"
#: A shape dimension must be below this: larger integers do not survive JSON readers (RFC 8259, section 6).
MAX_DIMENSION = 2**53
_HEX = frozenset("0123456789abcdef")


class Regions(NamedTuple):
    """The raw bytes of the two regions and how many entries each safetensors file has in the layout."""

    model: bytes
    layout: bytes
    counts: tuple[int, ...]  # one per file with a header_size, in ``files`` order


def model_entry(name: str, dtype: str, shape: Sequence[int], digest: str) -> list[Any]:
    """A model-region entry (``digest`` with or without its ``blake3:`` prefix)."""
    return [name, dtype, list(shape), digest[-64:]]


class _Shaped(Protocol):
    """A tensor's name and shape (a ``TensorRecord``, a safetensors header's ``TensorSlice``)."""

    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...


def check_shapes(tensors: Sequence[_Shaped], where: str) -> None:
    """Refuse a tensor whose shape a region cannot record exactly: a dimension JSON readers would round.

    Such a dimension (2**53 or more) needs a zero dimension beside it to fit a file.
    One scan in C over every dimension; the tensor is named only when one is found.
    """
    if max(chain.from_iterable(map(attrgetter("shape"), tensors)), default=0) < MAX_DIMENSION:
        return
    tensor = next(t for t in tensors if max(t.shape, default=0) >= MAX_DIMENSION)
    raise CkptpubError(
        f"{where}: tensor {tensor.name!r} has shape {list(tensor.shape)}, with a dimension of 2**53 or more, "
        "which a JSON manifest cannot record exactly"
    )


def encode_regions(
    files: Sequence[FileRecord], weights: Sequence[str], per_file: dict[str, list[list[Any]]]
) -> Regions:
    """The regions of a folder; ``per_file[path]`` holds each tensor's ``model_entry``, in offset order."""
    model, layout, counts = parts(files, weights, per_file, lambda entry: [entry[0]], list)
    return Regions(model_region(model), region_text(layout).encode(), counts)


def model_region(entries: list[list[Any]]) -> bytes:
    """The model region of the weight files' ``model_entry`` lists: sorted by name (code point order)."""
    return region_text(sorted(entries, key=itemgetter(0))).encode()


def region_text(entries: Sequence[Sequence[Any]]) -> str:
    """Each entry's canonical JSON, joined by ``,\\n``: the one text of a region.

    For the values an entry holds (strings, and integers below ``MAX_DIMENSION``)
    ``json.dumps`` with these options writes exactly ``canonical.canonical_json``'s
    bytes, in C. All entries are encoded at once; the line breaks go where one entry
    ends and the next begins (``],[``), which is nowhere else unless a name holds
    ``],[`` (then each entry is encoded on its own).
    """
    if not entries:
        return ""
    text = json.dumps(entries, ensure_ascii=False, separators=(",", ":"))
    if text.count("],[") == len(entries) - 1:
        return text[1:-1].replace("],[", "],\n[")
    return ",\n".join(json.dumps(e, ensure_ascii=False, separators=(",", ":")) for e in entries)


def entry_count(region: bytes) -> int:
    """How many entries a region holds, from its line breaks (one entry a line)."""
    return region.count(b"\n") + 1 if region else 0


def decode_regions(
    regions: Regions, files: Sequence[FileRecord], weights: Sequence[str], display_name: str
) -> tuple[TensorRecord, ...]:
    """Every tensor record, in file then offset order, after checking every rule of the two regions."""
    fail = failure_in(display_name)
    model = _model_columns(regions.model, display_name, fail)
    layout = _entries(regions.layout, "layout region", display_name, fail)

    def names_of(block: Sequence[list[Any]], where: str) -> Iterable[str]:
        if set(map(len, block)) - {1} or set(map(type, chain.from_iterable(block))) - {str}:
            raise fail(f"{where}: a weight file's entry is not [name]")
        return map(itemgetter(0), block)

    return assemble(
        model, layout, regions.counts, files, weights, names_of, lambda b, w: _columns(b, w, fail), fail
    )


def decode_model(model: bytes, display_name: str) -> dict[str, ModelEntry]:
    """The model region by tensor name, checked; what ``diff`` needs, without placing any tensor."""
    return model_entries(_model_columns(model, display_name, failure_in(display_name)))


def _model_columns(model: bytes, display_name: str, fail: Fail) -> Columns:
    columns = _columns(_entries(model, "model region", display_name, fail), "model region", fail)
    if not all(map(operator.lt, columns.names, columns.names[1:])):
        raise fail("model region: names are not sorted and unique")
    return columns


def _entries(region: bytes, what: str, display_name: str, fail: Fail) -> list[Any]:
    """A region's entries, decoded strictly and checked to be its one canonical text."""
    if not region:
        return []
    entries = loads_strict(b"[" + region + b"]", display_name, what)
    if set(map(type, entries)) - {list}:
        raise fail(f"{what}: an entry is not an array")
    if region_text(entries).encode() != region:
        raise fail(
            f"{what}: not in canonical form (entries are canonical JSON, one a line, joined by ',\\n')"
        )
    return list(entries)


def _columns(entries: Sequence[Any], where: str, fail: Fail) -> Columns:
    """Split ``[name, DTYPE, [dims], hex]`` entries into columns, checking each rule on whole columns."""
    if not entries:
        return Columns([], [], [], [])
    if set(map(len, entries)) - {4}:
        raise fail(f"{where}: an entry is not [name, dtype, shape, digest]")
    names, dtypes, shapes, hexes = zip(*entries, strict=True)
    if set(map(type, names)) - {str} or "" in names:
        raise fail(f"{where}: a tensor name is not a non-empty string")
    if set(map(type, dtypes)) - {str}:
        raise fail(f"{where}: a dtype is not a string")
    if not set(dtypes) <= DTYPE_BITS.keys():
        raise fail(f"{where}: unknown dtype {sorted(set(dtypes) - DTYPE_BITS.keys())[0][:100]!r}")
    _check_shapes(shapes, where, fail)
    digests = "".join(hexes) if not set(map(type, hexes)) - {str} else ""
    if len(digests) != 64 * len(hexes) or not set(digests) <= _HEX:
        raise fail(f"{where}: a digest is not 64 lowercase hex digits")
    return Columns(
        list(names), list(dtypes), list(map(tuple, shapes)), list(map(DIGEST_PREFIX.__add__, hexes))
    )


def _check_shapes(shapes: Sequence[Any], where: str, fail: Fail) -> None:
    """Every shape an array of integers in ``[0, MAX_DIMENSION)`` (types checked on every dimension)."""
    if set(map(type, shapes)) - {list} or set(map(type, chain.from_iterable(shapes))) - {int}:
        raise fail(f"{where}: a shape is not an array of non-negative integers")
    dims = set(chain.from_iterable(shapes))
    if dims and min(dims) < 0:
        raise fail(f"{where}: a shape is not an array of non-negative integers")
    if dims and max(dims) >= MAX_DIMENSION:
        raise fail(f"{where}: a shape dimension is 2**53 or more")
