"""What a manifest says of each tensor and file, and where each tensor lies.

A manifest's entries (``regions``) have two parts: a *model* part (each weight
tensor's name, dtype, shape and digest, sorted by name) and a *layout* part (each
safetensors file's tensors in offset order; a weight file's by name only). Neither
stores offsets: a file's tensors tile its data region, so each begins where the one
before ends and is as long as its dtype and shape say. ``check_layout`` checks the
decoded parts, and ``Decoded.shards`` places each file's tensors that way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import accumulate, chain, pairwise, repeat
from math import prod
from operator import attrgetter, mul
from typing import NamedTuple, TypeVar

from ..errors import CkptpubError
from .digest import DIGEST_PREFIX
from .safetensors import DTYPE_BITS

#: Makes the error for a broken rule of one manifest (``failure_in``).
Fail = Callable[[str], CkptpubError]
#: One tensor's entry as the regions encode it (a JSON array, or its text).
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
    """Decoded entries as columns; ``hexes``: each digest's 64 hex digits, without the ``blake3:`` prefix.

    The prefix is added where a digest is shown or compared with a computed one
    (``entry``, ``records``, ``verify``): 100k prefixed copies cost a reader that only
    checks the entries (``show``, ``ls``) a few tens of milliseconds for nothing.
    """

    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    hexes: list[str]

    def digests(self) -> Iterator[str]:
        """Each digest as ckptpub writes it elsewhere: ``blake3:<64 hex>``."""
        return map(DIGEST_PREFIX.__add__, self.hexes)

    def entry(self, row: int) -> ModelEntry:
        """What the columns say of the tensor in ``row``: its dtype, shape and digest."""
        return ModelEntry(self.dtypes[row], self.shapes[row], DIGEST_PREFIX + self.hexes[row])

    def take(self, rows: list[int]) -> Columns:
        return Columns(
            list(map(self.names.__getitem__, rows)),
            list(map(self.dtypes.__getitem__, rows)),
            list(map(self.shapes.__getitem__, rows)),
            list(map(self.hexes.__getitem__, rows)),
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


class ShardTensors(NamedTuple):
    """One safetensors file's tensors in offset order, as columns, and where each ends.

    Tensors tile the file's data region, so tensor ``i`` lies at ``[ends[i - 1], ends[i])``
    (the first at 0). What ``verify`` compares with the file's header and hashes,
    without a record per tensor; ``records`` builds those when they are asked for.
    """

    shard: FileRecord
    columns: Columns
    ends: list[int]

    def begins(self) -> list[int]:
        """Where each tensor begins: 0, then where the one before it ends (none for a file of no tensor)."""
        return [0, *self.ends[:-1]] if self.ends else []

    def records(self) -> list[TensorRecord]:
        names, dtypes, shapes, _ = self.columns
        offsets = zip(self.begins(), self.ends, strict=True)
        path = repeat(self.shard.path)  # endless: zip stops at the columns' end
        rows = zip(names, dtypes, shapes, path, offsets, self.columns.digests(), strict=False)
        return list(map(tuple.__new__, repeat(TensorRecord), rows))  # TensorRecord._make, no call per row


#: A safetensors file's tensors in offset order, as the layout part lists them: a weight file's
#: as rows of the model part (their names, dtypes, shapes and digests are there), another's as columns.
Block = tuple[FileRecord, list[int] | Columns]


class Decoded(NamedTuple):
    """A manifest's entries once every rule holds: the model part (sorted by name), each file's block."""

    model: Columns
    layout: tuple[Block, ...]

    def shards(self) -> Iterator[ShardTensors]:
        """Each safetensors file's tensors as columns, placed by tiling (which the decoding checked)."""
        for shard, tensors in self.layout:
            columns = tensors if isinstance(tensors, Columns) else self.model.take(tensors)
            yield ShardTensors(shard, columns, list(accumulate(_sizes(columns, shard.path, CkptpubError))))

    def records(self) -> tuple[TensorRecord, ...]:
        """Every tensor record, in file then offset order."""
        return tuple(chain.from_iterable(map(ShardTensors.records, self.shards())))


def check_layout(
    model: Columns, blocks: Iterable[tuple[FileRecord, list[str] | Columns]], fail: Fail
) -> tuple[Block, ...]:
    """Each safetensors file's ``Block``, in file order, once every rule of the two parts holds.

    A weight file's block is decoded as the names of its tensors, in offset order
    (their dtype, shape and digest are the model's); another file's as its tensors'
    columns. Every model tensor must be in exactly one weight file, no name twice in
    one file, and each file's tensors must add up to its size. The work is ``map``
    over columns, not a Python call per tensor, and no column is copied per file:
    this keeps ``show``, ``ls`` and ``diff`` of 100k tensors well under a second.
    """
    listed = list(blocks)
    weight_blocks = [(shard, block) for shard, block in listed if not isinstance(block, Columns)]
    weight_rows = _rows_in(model.names, [names for _, names in weight_blocks])
    if weight_rows is None:
        raise _misplaced(model.names, weight_blocks, fail)
    model_sizes = _sizes(model, "model", fail)
    layout: list[Block] = []
    for shard, block in listed:
        if isinstance(block, Columns):
            if len(set(block.names)) != len(block.names):
                raise fail(f"{shard.path}: a tensor name occurs twice")
            tensors: list[int] | Columns = block
            total = sum(_sizes(block, shard.path, fail))
        else:
            tensors = next(weight_rows)
            total = sum(map(model_sizes.__getitem__, tensors))
        if shard.header_size is None or shard.header_size < 8 or shard.header_size + total != shard.size:
            raise fail(f"{shard.path}: header_size and tensors do not add up to the file size")
        layout.append((shard, tensors))
    return tuple(layout)


def _rows_in(names: list[str], blocks: list[list[str]]) -> Iterator[list[int]] | None:
    """Each block's names as rows of ``names`` (sorted, unique); None unless each name is in one block, once.

    Proved by sorting: the blocks' names, sorted, are ``names`` exactly when each is
    listed once. A safetensors file lists its tensors mostly sorted already, so the
    sort merges runs, several times cheaper at 100k tensors than a lookup per name.
    """
    listed = list(chain.from_iterable(blocks))
    order = sorted(range(len(listed)), key=listed.__getitem__)
    if list(map(listed.__getitem__, order)) != names:
        return None
    rows = [0] * len(order)
    for row, at in enumerate(order):
        rows[at] = row
    bounds = [0, *accumulate(map(len, blocks))]
    return (rows[start:end] for start, end in pairwise(bounds))


def _misplaced(names: list[str], blocks: list[tuple[FileRecord, list[str]]], fail: Fail) -> CkptpubError:
    """Why the weight files do not list each model tensor exactly once, naming the first entry at fault."""
    known = set(names)
    for shard, block in blocks:
        unknown = next((name for name in block if name not in known), None)
        if unknown is not None:
            return fail(f"layout: {shard.path}: {unknown[:200]!r} is not the name of a model tensor")
        if len(set(block)) != len(block):
            return fail(f"{shard.path}: a tensor name occurs twice")
    return fail("layout: the weight files do not hold each model tensor exactly once")


def decoded_from_records(
    tensors: Iterable[TensorRecord], files: Sequence[FileRecord], weights: Sequence[str]
) -> Decoded:
    """The columns of a manifest held as records (``Manifest(...)`` built from ``TensorRecord``s)."""
    per_file: dict[str, list[TensorRecord]] = {}
    for tensor in tensors:
        per_file.setdefault(tensor.file, []).append(tensor)
    weight_files = set(weights)
    model = sorted((t for t in chain.from_iterable(per_file.values()) if t.file in weight_files), key=_NAME)
    layout = tuple(
        (shard, _columns_of(sorted(per_file.get(shard.path, []), key=_OFFSETS)))
        for shard in files
        if shard.header_size is not None
    )
    return Decoded(_columns_of(model), layout)


def _columns_of(tensors: Sequence[TensorRecord]) -> Columns:
    hexes = [t.digest.removeprefix(DIGEST_PREFIX) for t in tensors]
    return Columns([t.name for t in tensors], [t.dtype for t in tensors], [t.shape for t in tensors], hexes)


_NAME, _OFFSETS = attrgetter("name"), attrgetter("data_offsets")


def _sizes(columns: Columns, where: str, fail: Fail) -> list[int]:
    """Each tensor's size in bytes: element count (once per distinct shape) times the dtype's width.

    Two lookups and a product per tensor, no tuple per tensor: 100k sizes in tens of milliseconds.
    """
    _, dtypes, shapes, _ = columns
    numel = {shape: prod(shape) for shape in set(shapes)}
    bits = list(map(mul, map(DTYPE_BITS.__getitem__, dtypes), map(numel.__getitem__, shapes)))
    if any(size % 8 for size in set(bits)):
        row = next(row for row, size in enumerate(bits) if size % 8)
        raise fail(f"{where}: shape {list(shapes[row])} of {dtypes[row]} is not a whole number of bytes")
    return [size // 8 for size in bits]


def model_entries(columns: Columns) -> dict[str, ModelEntry]:
    """The model part by tensor name: what ``diff`` needs, without placing any tensor."""
    entries = zip(columns.dtypes, columns.shapes, columns.digests(), strict=True)
    return dict(zip(columns.names, map(tuple.__new__, repeat(ModelEntry), entries), strict=True))
