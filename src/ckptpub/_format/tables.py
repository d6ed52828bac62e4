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
every line splits one way. ``decode_tables`` checks every rule before returning the entries.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence
from operator import itemgetter
from typing import NamedTuple

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
    model, layout, counts = parts(files, weights, per_file, lambda entry: entry[0] + "\n", itemgetter(1))
    return Tables(model_table(model), "".join(layout).encode(), counts)


def model_table(entries: list[tuple[str, str]]) -> bytes:
    """The model table of ``(name, line)`` pairs of the weight files' tensors: the lines sorted by name."""
    return "".join(text for _, text in sorted(entries)).encode()


def decode_tables(
    tables: Tables, files: Sequence[FileRecord], weights: Sequence[str], display_name: str
) -> Decoded:
    """The entries of the two tables, once every rule of both holds.

    The work is whole-table string operations and ``map`` over columns, not a
    Python loop per tensor (``records.check_layout``).
    """
    fail = failure_in(display_name)
    model = _model_columns(tables.model, fail)
    layout = _text(tables.layout, "layout table", fail).split("\n")[:-1] if tables.layout else []
    if sum(tables.counts) != len(layout):
        raise fail("layout table: tensor counts do not match its lines")

    def blocks() -> Iterator[tuple[FileRecord, list[str] | Columns]]:
        start = 0
        for shard, count, holds_weights in shard_blocks(files, weights, tables.counts, fail):
            lines = layout[start : start + count]
            start += count
            where = f"layout table: {shard.path}"
            yield (
                shard,
                lines if holds_weights else _columns("\n".join(lines) + "\n" if lines else "", where, fail),
            )

    return Decoded(model, check_layout(model, blocks(), fail))


def decode_model(model: bytes, display_name: str) -> dict[str, ModelEntry]:
    """The model table by tensor name, checked; what ``diff`` needs, without placing any tensor."""
    return model_entries(_model_columns(model, failure_in(display_name)))


def _model_columns(model: bytes, fail: Fail) -> Columns:
    columns = _columns(_text(model, "model table", fail), "model table", fail)
    if not all(map(operator.lt, columns.names, columns.names[1:])):
        raise fail("model table: names are not sorted and unique")
    return columns


def _text(data: bytes, what: str, fail: Fail) -> str:
    if data and not data.endswith(b"\n"):
        raise fail(f"{what} does not end with a newline")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise fail(f"{what} is not valid UTF-8") from None


def _columns(text: str, where: str, fail: Fail) -> Columns:
    """Split ``name TAB DTYPE TAB shape TAB hex`` lines, checking each rule on whole columns."""
    if not text:
        return Columns([], [], [], [])
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
    parsed = {shape: _shape(shape, where, fail) for shape in set(shapes)}
    if not is_hex("".join(hexes), 64 * len(hexes)):
        raise fail(f"{where}: a digest is not 64 lowercase hex digits")
    return Columns(names, dtypes, list(map(parsed.__getitem__, shapes)), hexes)


def _shape(text: str, where: str, fail: Fail) -> tuple[int, ...]:
    dims = text.split(",") if text else []
    if not all(d.isascii() and d.isdigit() and (d == "0" or d[0] != "0") and len(d) < 19 for d in dims):
        raise fail(f"{where}: shape {text[:100]!r} is not comma-separated non-negative integers")
    return tuple(int(d) for d in dims)
