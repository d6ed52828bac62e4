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
  model-region fields. Offsets are not stored (``records.Decoded.shards`` places the tensors).

Entries are canonical JSON joined by ``,\\n``: one byte form per region, which
``decode_regions`` checks (and every other rule) before returning the entries. The
decoding is whole-region work in C (``json``, ``map``, ``zip``), not a Python call per
tensor, so 100k tensors decode in a few tenths of a second.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, islice
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple, Protocol

from ..errors import CkptpubError
from .records import (
    Columns,
    Decoded,
    Fail,
    FileRecord,
    ModelEntry,
    check_layout,
    failure_in,
    is_hex,
    model_entries,
    parts,
    shard_blocks,
)
from .safetensors import DTYPE_BITS
from .strict_json import loads_strict

#: Between the model region and the layout region, and after the layout region: the document's glue.
BETWEEN = b'\n],"layout":[\n'
END = b"\n]}\n"
#: A shape dimension must be below this: larger integers do not survive JSON readers (RFC 8259, section 6).
MAX_DIMENSION = 2**53
#: What separates two entries once a region is split at its quotes: ``"],\n["``.
_SEPARATOR = "],\n["
#: Bytes a JSON string holds only escaped: a region without backslashes holds none but its line breaks.
_CONTROL = bytes(range(32))
#: A shape between dtype and digest: ``,[`` canonical non-negative integers ``],`` (below 2**53: 16 digits).
_SHAPE = re.compile(r",\[(?:(?:0|[1-9][0-9]{0,15})(?:,(?:0|[1-9][0-9]{0,15}))*)?\],")
_CANONICAL = "entries are canonical JSON, one a line, joined by ',\\n'"


class _Tensor(Protocol):
    """A tensor's name, dtype and shape (a ``TensorRecord``, a safetensors header's ``TensorSlice``)."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...


_NAME_OF, _DTYPE_OF, _SHAPE_OF = attrgetter("name"), attrgetter("dtype"), attrgetter("shape")
_LAST_64 = itemgetter(slice(-64, None))


class Regions(NamedTuple):
    """The raw bytes of the two regions and how many entries each safetensors file has in the layout.

    A manifest read from a file holds views of the bytes read (no copy: 18 MB at 100k
    tensors, a fifth of an engine's key), one written holds its own bytes.
    """

    model: bytes | memoryview
    layout: bytes | memoryview
    counts: tuple[int, ...]  # one per file with a header_size, in ``files`` order


#: A model-region entry: name, dtype, shape, 64 hex digits (JSON writes the tuples as arrays).
Entry = tuple[str, str, tuple[int, ...], str]


def entries_of(tensors: Sequence[_Tensor], digests: Iterable[str]) -> list[Entry]:
    """The model entries of ``tensors`` with these digests (``blake3:`` prefix or not), in their order.

    Built with ``map`` and ``zip``, no Python call per tensor: 100k tensors in milliseconds.
    """
    hexes = map(_LAST_64, islice(digests, len(tensors)))
    return list(
        zip(map(_NAME_OF, tensors), map(_DTYPE_OF, tensors), map(_SHAPE_OF, tensors), hexes, strict=True)
    )


def check_shapes(tensors: Sequence[_Tensor], where: str) -> None:
    """Refuse a tensor whose shape a region cannot record exactly: a dimension JSON readers would round.

    Such a dimension (2**53 or more) needs a zero dimension beside it to fit a file.
    One scan in C over every dimension; the tensor is named only when one is found.
    """
    if max(chain.from_iterable(map(_SHAPE_OF, tensors)), default=0) < MAX_DIMENSION:
        return
    tensor = next(t for t in tensors if max(t.shape, default=0) >= MAX_DIMENSION)
    raise CkptpubError(
        f"{where}: tensor {tensor.name!r} has shape {list(tensor.shape)}, with a dimension of 2**53 or more, "
        "which a JSON manifest cannot record exactly"
    )


def encode_regions(
    files: Sequence[FileRecord], weights: Sequence[str], per_file: dict[str, list[Entry]]
) -> Regions:
    """The regions of a folder; ``per_file[path]``: its tensors' entries (``entries_of``), in offset order."""
    model, layout, counts = parts(files, weights, per_file, _NAME_ONLY, tuple)
    return Regions(model_region(model), region_text(layout).encode(), counts)


#: A weight file's layout entry: the name alone, ``(name,)``.
_NAME_ONLY = itemgetter(slice(0, 1))


def model_region(entries: list[Entry]) -> bytes:
    """The model region of the weight files' entries: sorted by name (code point order; names are unique)."""
    return region_text(sorted(entries)).encode()


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


def entry_count(region: bytes | memoryview) -> int:
    """How many entries a region holds, from its line breaks (one entry a line)."""
    return bytes(region).count(b"\n") + 1 if region else 0


def decode_regions(
    regions: Regions, files: Sequence[FileRecord], weights: Sequence[str], display_name: str
) -> Decoded:
    """The entries of the two regions, once every rule of both holds."""
    try:
        return _decoded(regions, files, weights, display_name, quoted=True)
    except _NotQuotable:  # the JSON reader says exactly what is wrong (or, if nothing is, decodes it)
        return _decoded(regions, files, weights, display_name, quoted=False)


def decode_model(model: bytes | memoryview, display_name: str) -> dict[str, ModelEntry]:
    """The model region by tensor name, checked; what ``diff`` needs, without placing any tensor."""
    fail = failure_in(display_name)
    try:
        return model_entries(_model_columns(model, display_name, fail, quoted=True))
    except _NotQuotable:
        return model_entries(_model_columns(model, display_name, fail, quoted=False))


def _decoded(
    regions: Regions, files: Sequence[FileRecord], weights: Sequence[str], display_name: str, quoted: bool
) -> Decoded:
    fail = failure_in(display_name)
    model = _model_columns(regions.model, display_name, fail, quoted)
    layout = _reader(regions.layout, "layout region", display_name, fail, quoted)
    if sum(regions.counts) != layout.entries:
        raise fail("layout region: tensor counts do not match its entries")

    def blocks() -> Iterator[tuple[FileRecord, list[str] | Columns]]:
        for shard, count, holds_weights in shard_blocks(files, weights, regions.counts, fail):
            where = f"layout region: {shard.path}"
            yield shard, layout.names(count, where) if holds_weights else layout.full(count, where)

    decoded = Decoded(model, check_layout(model, blocks(), fail))
    layout.finish()
    return decoded


def _model_columns(model: bytes | memoryview, display_name: str, fail: Fail, quoted: bool) -> Columns:
    reader = _reader(model, "model region", display_name, fail, quoted)
    columns = reader.full(reader.entries, "model region")
    reader.finish()
    if not all(map(operator.lt, columns.names, columns.names[1:])):
        raise fail("model region: names are not sorted and unique")
    return columns


class _Reader(Protocol):
    """A region's entries, taken in order: a weight file's ``[name]`` entries, or whole entries as columns."""

    entries: int

    def names(self, count: int, where: str) -> list[str]: ...
    def full(self, count: int, where: str) -> Columns: ...
    def finish(self) -> None:
        """Refuse entries left over after the last one taken."""


def _reader(region: bytes | memoryview, what: str, display_name: str, fail: Fail, quoted: bool) -> _Reader:
    """``_Quoted`` when asked and no string of the region has an escape; else ``_Decoded``."""
    try:
        text = str(region, "utf-8")
    except UnicodeDecodeError:
        raise fail(f"{what} is not valid UTF-8") from None
    if quoted and "\\" not in text:
        return _Quoted(text, bytes(region), fail)
    return _Decoded(region, what, display_name, fail)


class _NotQuotable(Exception):  # noqa: N818 - not an error: a signal to decode the other way
    """The region is not in ``_Quoted``'s grammar: the JSON reader decides (and names the problem)."""


class _Quoted:
    """A region without a backslash, split at its quotes: each string is exactly the text between two.

    A canonical entry ``["N","D",[S],"H"]`` followed by ``],\\n[`` (or the region's
    last ``]``) splits into six pieces ``N , D ,[S], H ],\\n[``, and ``["N"]`` into two,
    after a first ``[``; checking every piece of that grammar with whole-column string
    work (no JSON decoding, no object per tensor) is checking the canonical text.
    Without backslashes a name can hold no quote, no escape and, once raw control
    characters are refused, no line break: its JSON is ``"N"`` exactly. The only raw
    control characters a region may hold are the line breaks between its entries,
    which is checked once over the region's bytes (``data``).
    """

    def __init__(self, text: str, data: bytes, fail: Fail) -> None:
        self.fail = fail
        self.entries = text.count("\n") + 1 if text else 0
        if len(data) - len(data.translate(None, _CONTROL)) != max(self.entries - 1, 0):
            raise _NotQuotable
        self.pieces = text.split('"') if text else ["[", "]"]
        self.at = 1
        if self.pieces[0] != "[":
            raise _NotQuotable

    def names(self, count: int, where: str) -> list[str]:
        names, separators = self._take(count, 2)
        self._separators(separators)
        return names

    def full(self, count: int, where: str) -> Columns:
        names, commas, dtypes, shapes, hexes, separators = self._take(count, 6)
        self._separators(separators)
        if set(commas) - {","} or not all(map(_SHAPE.fullmatch, set(shapes))):
            raise _NotQuotable
        parsed = {
            text: tuple(map(int, text[2:-2].split(","))) if text != ",[]," else () for text in set(shapes)
        }
        return _checked(names, dtypes, list(map(parsed.__getitem__, shapes)), hexes, where, self.fail)

    def finish(self) -> None:
        if self.at != len(self.pieces):
            raise _NotQuotable

    def _take(self, count: int, width: int) -> list[list[str]]:
        """The next ``count`` entries of ``width`` pieces each, as ``width`` columns of pieces."""
        start, end = self.at, self.at + count * width
        if end > len(self.pieces):
            raise _NotQuotable
        self.at = end
        return [self.pieces[start + column : end : width] for column in range(width)]

    def _separators(self, separators: list[str]) -> None:
        """Between entries ``],\\n[``; after the region's last one (where the pieces end) ``]``."""
        last = "]" if self.at == len(self.pieces) else _SEPARATOR
        between = separators[:-1]  # counted, not put in a set: 100k equal strings need no hashing
        if separators and (separators[-1] != last or between.count(_SEPARATOR) != len(between)):
            raise _NotQuotable


class _Decoded:
    """A region with a backslash: decoded as JSON, checked to be its canonical text, taken in order."""

    def __init__(self, region: bytes | memoryview, what: str, display_name: str, fail: Fail) -> None:
        self.fail = fail
        self.items = loads_strict(b"[" + region + b"]", display_name, what)
        if set(map(type, self.items)) - {list}:
            raise fail(f"{what}: an entry is not an array")
        if region_text(self.items).encode() != region:
            raise fail(f"{what}: not in canonical form ({_CANONICAL})")
        self.entries = len(self.items)
        self.at = 0

    def finish(self) -> None:
        if self.at != len(self.items):
            raise self.fail("a region holds more entries than its files' tensor counts")

    def _take(self, count: int) -> list[list[Any]]:
        taken: list[list[Any]] = self.items[self.at : self.at + count]
        self.at += count
        return taken

    def names(self, count: int, where: str) -> list[str]:
        block = self._take(count)
        if set(map(len, block)) - {1} or set(map(type, chain.from_iterable(block))) - {str}:
            raise self.fail(f"{where}: a weight file's entry is not [name]")
        return list(map(itemgetter(0), block))

    def full(self, count: int, where: str) -> Columns:
        block = self._take(count)
        if not block:
            return Columns([], [], [], [])
        if set(map(len, block)) - {4}:
            raise self.fail(f"{where}: an entry is not [name, dtype, shape, digest]")
        names, dtypes, shapes, hexes = zip(*block, strict=True)
        if set(map(type, names)) - {str} or set(map(type, dtypes)) - {str} or set(map(type, hexes)) - {str}:
            raise self.fail(f"{where}: a name, dtype or digest is not a string")
        if set(map(type, shapes)) - {list} or set(map(type, chain.from_iterable(shapes))) - {int}:
            raise self.fail(f"{where}: a shape is not an array of non-negative integers")
        return _checked(list(names), list(dtypes), list(map(tuple, shapes)), list(hexes), where, self.fail)


def _checked(
    names: list[str],
    dtypes: list[str],
    shapes: list[tuple[int, ...]],
    hexes: list[str],
    where: str,
    fail: Fail,
) -> Columns:
    """Columns of whole entries, once each rule holds for every row (checked on whole columns)."""
    if "" in names:
        raise fail(f"{where}: a tensor name is empty")
    if not set(dtypes) <= DTYPE_BITS.keys():
        raise fail(f"{where}: unknown dtype {sorted(set(dtypes) - DTYPE_BITS.keys())[0][:100]!r}")
    dims = set(chain.from_iterable(set(shapes)))
    if dims and min(dims) < 0:
        raise fail(f"{where}: a shape is not an array of non-negative integers")
    if dims and max(dims) >= MAX_DIMENSION:
        raise fail(f"{where}: a shape dimension is 2**53 or more")
    if not is_hex("".join(hexes), 64 * len(hexes)):
        raise fail(f"{where}: a digest is not 64 lowercase hex digits")
    return Columns(names, dtypes, shapes, hexes)
