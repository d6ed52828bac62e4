"""ckptpub/2's two tables: every tensor as one line of text, so reading a manifest is string work.

A 100k-tensor checkpoint has 100k tensor entries; as JSON objects (ckptpub/1) they
cost about a second to decode before anything is checked. ckptpub/2 stores them as
two UTF-8 tables after a one-line JSON header (``docs/format.md``):

* the *model table*: one line ``name TAB DTYPE TAB d0,d1,.. TAB <64 hex>`` per tensor
  of the weight files, sorted by name. The identity commits to its bytes, so an
  engine's key needs one BLAKE3 pass over them and no per-tensor work;
* the *layout table*: each safetensors file's tensors in offset order (the order of
  ``files``, ``tensors`` lines per file). A weight file's line is the name alone (its
  dtype, shape and digest are in the model table); another file's line has the four
  model-table fields. Offsets are not stored: tensors tile the data region, so each
  begins where the one before ends and is as long as its dtype and shape say.

A name holding a tab or a newline cannot be written (publishing refuses it), so
every line splits one way. ``decode_tables`` checks every rule before returning records.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate, repeat
from math import prod
from typing import NamedTuple

from ..errors import CkptpubError
from .digest import DIGEST_PREFIX
from .safetensors import DTYPE_BITS

_HEX = frozenset("0123456789abcdef")
_Fail = Callable[[str], CkptpubError]


class TensorRecord(NamedTuple):
    """One tensor: where it lies (``file``, ``data_offsets`` relative to the data region) and its digest."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    data_offsets: tuple[int, int]
    digest: str


class FileRecord(NamedTuple):
    """One file of the folder.

    For a safetensors file ``header_size`` is set and ``digest`` covers bytes
    ``[0, header_size)`` only: the rest of the file is exactly its tensors, each
    with a digest of its own, so every byte is hashed once. For any other file
    ``digest`` covers the whole file.
    """

    path: str
    size: int
    digest: str
    header_size: int | None = None


class ModelEntry(NamedTuple):
    """What the identity says of one model tensor: its dtype, shape and digest (not where it lies)."""

    dtype: str
    shape: tuple[int, ...]
    digest: str


class Tables(NamedTuple):
    """The raw bytes of the two tables and how many tensor lines each safetensors file has."""

    model: bytes
    layout: bytes
    counts: tuple[int, ...]  # one per file with a header_size, in ``files`` order


def check_name(name: str, where: str) -> None:
    """Refuse a tensor name a table line cannot hold: empty, or with a tab or newline in it."""
    if not name or "\t" in name or "\n" in name:
        raise CkptpubError(
            f"{where}: tensor name {name!r} is empty or holds a tab or newline, which a ckptpub/2 manifest "
            "cannot record"
        )


def line(name: str, dtype: str, shape: Iterable[int], digest: str) -> str:
    """A model-table line (``digest`` with or without its ``blake3:`` prefix)."""
    return f"{name}\t{dtype}\t{','.join(map(str, shape))}\t{digest[-64:]}\n"


def encode_tables(
    files: Sequence[FileRecord], weights: Sequence[str], per_file: dict[str, list[tuple[str, str]]]
) -> Tables:
    """The tables of a folder; ``per_file[path]`` is ``[(name, model-table line), ...]`` in offset order."""
    weight_files = set(weights)
    model: list[tuple[str, str]] = []
    layout: list[str] = []
    counts: list[int] = []
    for record in files:
        if record.header_size is None:
            continue
        entries = per_file.get(record.path, [])
        counts.append(len(entries))
        if record.path in weight_files:
            model.extend(entries)
            layout.extend(name + "\n" for name, _ in entries)
        else:
            layout.extend(text for _, text in entries)
    return Tables(model_table(model), "".join(layout).encode(), tuple(counts))


def model_table(entries: list[tuple[str, str]]) -> bytes:
    """The model table of ``(name, line)`` pairs of the weight files' tensors: the lines sorted by name."""
    return "".join(text for _, text in sorted(entries)).encode()


def decode_tables(
    tables: Tables, files: Sequence[FileRecord], weights: Sequence[str], display_name: str
) -> tuple[TensorRecord, ...]:
    """Every tensor record, in file then offset order, after checking every rule of the two tables.

    The work is whole-table string operations and ``map`` over columns, not a
    Python loop per tensor: this is what keeps ``verify`` and ``diff`` of 100k
    tensors well under a second.
    """
    fail = _failure_in(display_name)
    model = _model_columns(tables.model, fail)
    position = dict(zip(model.names, range(len(model.names)), strict=True))
    layout = _text(tables.layout, "layout table", fail).split("\n")[:-1] if tables.layout else []
    shards = [f for f in files if f.header_size is not None]
    if len(shards) != len(tables.counts) or sum(tables.counts) != len(layout):
        raise fail("layout table: tensor counts do not match its lines")
    weight_files = set(weights)
    records: list[TensorRecord] = []
    used: list[int] = []
    start = 0
    for shard, count in zip(shards, tables.counts, strict=True):
        block = layout[start : start + count]
        start += count
        if shard.path in weight_files:
            try:
                rows = list(map(position.__getitem__, block))
            except KeyError as error:
                raise fail(
                    f"layout table: {shard.path}: {error.args[0][:200]!r} is not a model-table tensor name"
                ) from None
            used += rows
            columns = model.take(rows)
        else:
            columns = _columns("\n".join(block) + "\n" if block else "", f"layout table: {shard.path}", fail)
        if len(set(columns.names)) != len(columns.names):
            raise fail(f"{shard.path}: a tensor name occurs twice")
        records += _placed(columns, shard, fail)
    if len(used) != len(model.names) or len(set(used)) != len(used):
        raise fail("layout table: the weight files do not hold each model-table tensor exactly once")
    return tuple(records)


def decode_model(model: bytes, display_name: str) -> dict[str, ModelEntry]:
    """The model table by tensor name, checked; what ``diff`` needs, without placing any tensor."""
    fail = _failure_in(display_name)
    columns = _model_columns(model, fail)
    shapes = {text: _shape(text, "model table", fail) for text in set(columns.shapes)}
    entries = zip(columns.dtypes, map(shapes.__getitem__, columns.shapes), columns.digests, strict=True)
    return dict(zip(columns.names, map(tuple.__new__, repeat(ModelEntry), entries), strict=True))


def _failure_in(display_name: str) -> _Fail:
    """The error for a broken rule of the manifest named ``display_name``."""
    return lambda message: CkptpubError(f"{display_name}: {message}")


def _model_columns(model: bytes, fail: _Fail) -> _Columns:
    columns = _columns(_text(model, "model table", fail), "model table", fail)
    if not all(map(operator.lt, columns.names, columns.names[1:])):
        raise fail("model table: names are not sorted and unique")
    return columns


class _Columns(NamedTuple):
    """Table lines split into columns (``digests`` with their ``blake3:`` prefix)."""

    names: list[str]
    dtypes: list[str]
    shapes: list[str]
    digests: list[str]

    def take(self, rows: list[int]) -> _Columns:
        return _Columns(*(list(map(column.__getitem__, rows)) for column in self))


def _text(data: bytes, what: str, fail: _Fail) -> str:
    if data and not data.endswith(b"\n"):
        raise fail(f"{what} does not end with a newline")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise fail(f"{what} is not valid UTF-8") from None


def _columns(text: str, where: str, fail: _Fail) -> _Columns:
    """Split ``name TAB DTYPE TAB shape TAB hex`` lines, checking each rule on whole columns."""
    if not text:
        return _Columns([], [], [], [])
    fields = text[:-1].replace("\n", "\t").split("\t")
    names, dtypes, shapes, hexes = fields[0::4], fields[1::4], fields[2::4], fields[3::4]
    # Rebuilding the text from four columns proves every line had exactly four fields.
    if (
        len(fields) % 4
        or "\n".join(map("\t".join, zip(names, dtypes, shapes, hexes, strict=True))) != text[:-1]
    ):
        raise fail(f"{where}: a line is not name, dtype, shape and digest separated by tabs")
    if "" in names:
        raise fail(f"{where}: a tensor name is empty")
    if not set(dtypes) <= DTYPE_BITS.keys():
        raise fail(f"{where}: unknown dtype {sorted(set(dtypes) - DTYPE_BITS.keys())[0][:100]!r}")
    for shape in set(shapes):
        _shape(shape, where, fail)
    digests = "".join(hexes)
    if len(digests) != 64 * len(hexes) or not set(digests) <= _HEX:
        raise fail(f"{where}: a digest is not 64 lowercase hex digits")
    return _Columns(names, dtypes, shapes, list(map(DIGEST_PREFIX.__add__, hexes)))


def _shape(text: str, where: str, fail: _Fail) -> tuple[int, ...]:
    dims = text.split(",") if text else []
    if not all(d.isascii() and d.isdigit() and (d == "0" or d[0] != "0") and len(d) < 19 for d in dims):
        raise fail(f"{where}: shape {text[:100]!r} is not comma-separated non-negative integers")
    return tuple(int(d) for d in dims)


def _placed(columns: _Columns, shard: FileRecord, fail: _Fail) -> list[TensorRecord]:
    """The records of one shard: offsets from tiling, and the total checked against the file's size."""
    sizes: dict[tuple[str, str], int] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for dtype, text in set(zip(columns.dtypes, columns.shapes, strict=True)):
        shapes[text] = shape = _shape(text, shard.path, fail)
        bits = prod(shape) * DTYPE_BITS[dtype]
        if bits % 8:
            raise fail(f"{shard.path}: shape {list(shape)} of {dtype} is not a whole number of bytes")
        sizes[dtype, text] = bits // 8
    ends = list(accumulate(map(sizes.__getitem__, zip(columns.dtypes, columns.shapes, strict=True))))
    if (
        shard.header_size is None
        or shard.header_size < 8
        or shard.header_size + (ends[-1] if ends else 0) != shard.size
    ):
        raise fail(f"{shard.path}: header_size and tensors do not add up to the file size")
    offsets = zip([0, *ends[:-1]], ends, strict=True)
    rows = zip(
        columns.names,
        columns.dtypes,
        map(shapes.__getitem__, columns.shapes),
        repeat(shard.path),
        offsets,
        columns.digests,
    )
    return list(
        map(tuple.__new__, repeat(TensorRecord), rows)
    )  # what TensorRecord._make does, without a call per row
