"""What a manifest says of each tensor and file, whatever its format, and where each tensor lies.

``ckptpub/2`` (``tables``) and ``ckptpub/3`` (``regions``) store the same records in
two encodings of one structure: a *model* part (each weight tensor's name, dtype,
shape and digest, sorted by name) and a *layout* part (each safetensors file's
tensors in offset order; a weight file's by name only). Neither stores offsets: a
file's tensors tile its data region, so each begins where the one before ends and
is as long as its dtype and shape say. ``assemble`` turns the decoded parts into
records that way, for both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import accumulate, repeat
from math import prod
from typing import NamedTuple, TypeVar

from ..errors import CkptpubError
from .safetensors import DTYPE_BITS

#: Makes the error for a broken rule of one manifest (``failure_in``).
Fail = Callable[[str], CkptpubError]
#: One tensor's entry as a format encodes it (a ``/2`` line, a ``/3`` JSON array).
Entry = TypeVar("Entry")
Listed = TypeVar("Listed")


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


def is_hex(text: str, length: int) -> bool:
    """Whether ``text`` is ``length`` lowercase hex digits (in C: 100k digests in a few milliseconds)."""
    return len(text) == length and text.isascii() and not text.encode().translate(None, b"0123456789abcdef")


def failure_in(display_name: str) -> Fail:
    """The error for a broken rule of the manifest named ``display_name``."""
    return lambda message: CkptpubError(f"{display_name}: {message}")


def parts(
    files: Sequence[FileRecord],
    weights: Sequence[str],
    per_file: Mapping[str, list[Entry]],
    in_weight_file: Callable[[Entry], Listed],
    in_other_file: Callable[[Entry], Listed],
) -> tuple[list[Entry], list[Listed], tuple[int, ...]]:
    """What an encoder writes: the model part's entries (unsorted), the layout part's, each shard's count.

    ``per_file[path]`` holds each tensor's entry in offset order; the layout lists a
    weight file's tensors as ``in_weight_file(entry)`` (its name) and another file's
    as ``in_other_file(entry)`` (all of it).
    """
    weight_files = set(weights)
    model: list[Entry] = []
    layout: list[Listed] = []
    counts: list[int] = []
    for record in files:
        if record.header_size is None:
            continue
        entries = per_file.get(record.path, [])
        counts.append(len(entries))
        if record.path in weight_files:
            model.extend(entries)
            layout.extend(map(in_weight_file, entries))
        else:
            layout.extend(map(in_other_file, entries))
    return model, layout, tuple(counts)


class Columns(NamedTuple):
    """Decoded entries as columns (``digests`` with their ``blake3:`` prefix)."""

    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    digests: list[str]

    def take(self, rows: list[int]) -> Columns:
        return Columns(
            list(map(self.names.__getitem__, rows)),
            list(map(self.dtypes.__getitem__, rows)),
            list(map(self.shapes.__getitem__, rows)),
            list(map(self.digests.__getitem__, rows)),
        )


def shard_blocks(
    files: Sequence[FileRecord], weights: Sequence[str], counts: Sequence[int], fail: Fail
) -> list[tuple[FileRecord, int, bool]]:
    """Each safetensors file of ``files``, its tensor count in the layout part, whether it holds weights."""
    shards = [f for f in files if f.header_size is not None]
    if len(shards) != len(counts):
        raise fail("layout: tensor counts do not match the safetensors files")
    weight_files = set(weights)
    return [(shard, count, shard.path in weight_files) for shard, count in zip(shards, counts, strict=True)]


def assemble(
    model: Columns, blocks: Iterable[tuple[FileRecord, list[str] | Columns]], fail: Fail
) -> tuple[TensorRecord, ...]:
    """Every tensor record, in file then offset order, from the model part and each shard's layout block.

    A weight file's block is the names of its tensors, in offset order (their dtype,
    shape and digest are the model's); another file's is its tensors' columns. Every
    model tensor must be in exactly one weight file, and no name twice in one file.
    The work is ``map`` over columns, not a Python call per tensor: this keeps
    ``verify`` and ``diff`` of 100k tensors well under a second.
    """
    position = dict(zip(model.names, range(len(model.names)), strict=True))
    records: list[TensorRecord] = []
    used: list[int] = []
    for shard, block in blocks:
        if isinstance(block, Columns):
            columns = block
        else:
            try:
                rows = list(map(position.__getitem__, block))
            except KeyError as error:
                raise fail(
                    f"layout: {shard.path}: {error.args[0][:200]!r} is not the name of a model tensor"
                ) from None
            used += rows
            columns = model.take(rows)
        if len(set(columns.names)) != len(columns.names):
            raise fail(f"{shard.path}: a tensor name occurs twice")
        records += _place(columns, shard, fail)
    if len(used) != len(model.names) or len(set(used)) != len(used):
        raise fail("layout: the weight files do not hold each model tensor exactly once")
    return tuple(records)


def _place(columns: Columns, shard: FileRecord, fail: Fail) -> list[TensorRecord]:
    """The records of one shard's tensors, in offset order: offsets from tiling, the total checked.

    Sizes are computed once per distinct (dtype, shape) and the records built with
    ``map``, not a Python call per tensor.
    """
    names, dtypes, shapes, digests = columns
    sizes: dict[tuple[str, tuple[int, ...]], int] = {}
    for dtype, shape in set(zip(dtypes, shapes, strict=True)):
        bits = prod(shape) * DTYPE_BITS[dtype]
        if bits % 8:
            raise fail(f"{shard.path}: shape {list(shape)} of {dtype} is not a whole number of bytes")
        sizes[dtype, shape] = bits // 8
    ends = list(accumulate(map(sizes.__getitem__, zip(dtypes, shapes, strict=True))))
    if (
        shard.header_size is None
        or shard.header_size < 8
        or shard.header_size + (ends[-1] if ends else 0) != shard.size
    ):
        raise fail(f"{shard.path}: header_size and tensors do not add up to the file size")
    offsets = zip([0, *ends[:-1]], ends, strict=True)
    rows = zip(names, dtypes, shapes, repeat(shard.path), offsets, digests, strict=False)  # repeat: endless
    return list(map(tuple.__new__, repeat(TensorRecord), rows))  # TensorRecord._make without a call per row


def model_entries(columns: Columns) -> dict[str, ModelEntry]:
    """The model part by tensor name: what ``diff`` needs, without placing any tensor."""
    entries = zip(columns.dtypes, columns.shapes, columns.digests, strict=True)
    return dict(zip(columns.names, map(tuple.__new__, repeat(ModelEntry), entries), strict=True))
