"""What a folder says about its model: which safetensors files are the weights, and the config's meaning.

These rules mirror what an inference engine loads (vLLM: the top-level
``*.safetensors`` files, restricted to those ``model.safetensors.index.json`` names
when it exists), so the identity covers exactly the tensors an engine would hold.
Publishing and verifying both use them, so a manifest that claims other weight
files or another config than the folder's own is caught: ``claim_problems`` is that
check, the one rule for "does this manifest say what publishing this folder would
say about its shards, weights and config" (``ckptpub verify`` and the vLLM loader
both call it). The files are read here too: a shard's header (``read_layout``), a config
(``read_config``), the safetensors index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import chain, repeat
from operator import attrgetter, itemgetter
from typing import Any

from .._format.manifest import Manifest, config_meaning
from .._format.names import CONFIG_FILES, MANIFEST_NAME, SAFETENSORS_INDEX_NAME
from .._format.records import ShardTensors
from .._format.safetensors import ShardLayout, header_length, parse_header
from .._format.strict_json import loads_strict, loads_two_level
from ..errors import CkptpubError
from .objects import READ_THREADS, is_object_url
from .safe_open import FileId
from .scan import FolderEntry
from .sources import open_source, read_at, read_small_file

MAX_CONFIG_BYTES = 16 << 20
MAX_SAFETENSORS_INDEX_BYTES = 64 << 20
#: What ``read_layout`` reads first: the header of a shard of up to a few thousand tensors.
FIRST_READ_BYTES = 256 << 10


def is_shard_path(path: str) -> bool:
    """Whether publishing parses the file as a safetensors shard and lists its tensors (any folder depth)."""
    return path.endswith(".safetensors")


def read_layout(path: str, display_name: str, expect: FileId | None = None) -> ShardLayout:
    """Parse the header of the safetensors file (or ``s3://`` object) at ``path``; ``display_name`` goes
    in errors.

    ``expect`` is which file the folder scan saw (see ``sources.open_source``). One read
    of the first ``FIRST_READ_BYTES`` holds a typical header whole (one request for an
    object); a larger header costs one more. Raises ``CkptpubError`` for anything that
    is not a well-formed shard.
    """
    source = open_source(path, display_name, expect)
    try:
        file_size = source.size
        if file_size < 8:
            raise CkptpubError(
                f"{display_name}: truncated safetensors file ({file_size} bytes, no header length)"
            )
        first = read_at(source, 0, min(file_size, FIRST_READ_BYTES))
        header_len = header_length(first[:8], file_size, display_name)
        header = first[8 : 8 + header_len]
        if len(header) < header_len:
            header += read_at(source, len(first), header_len - len(header))
    finally:
        source.close()
    return parse_header(header, file_size, display_name)


def read_layouts(entries: Sequence[FolderEntry]) -> dict[str, ShardLayout | CkptpubError]:
    """``read_layout`` of each entry: its layout, or the error that says why it is not a shard.

    Objects of an ``s3://`` prefix are read ``READ_THREADS`` at a time: each header is a
    round trip to the store, and 163 of them one after another cost seconds. A folder's
    files are read in turn (a local ``open`` and ``read`` is microseconds).
    """

    def layout(entry: FolderEntry) -> ShardLayout | CkptpubError:
        try:
            return read_layout(entry.real_path, entry.path, entry.file_id)
        except CkptpubError as error:
            return error

    if entries and is_object_url(entries[0].real_path):
        with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="ckptpub-header") as pool:
            return dict(zip((e.path for e in entries), pool.map(layout, entries), strict=True))
    return {entry.path: layout(entry) for entry in entries}


def claim_problems(
    manifest: Manifest, entries: Mapping[str, FolderEntry], layouts: Mapping[str, ShardLayout]
) -> list[tuple[str, str]]:
    """``(path, what is wrong)`` for each claim of ``manifest`` that publishing ``entries`` would not make.

    ``entries`` are the folder's files by path (``scan_folder``); ``layouts`` the
    parsed header of every file of it that ``is_shard_path`` (``read_layout``).
    Checked, with the rules ``publish`` applies: a file is listed as a shard exactly
    when its name says it is one; each shard's tensor entries are its header's; the
    weight files are the folder's (``weight_files``: top-level shards, or those the
    index names); the config digests are the folder's config files'. So a manifest
    cannot hide a safetensors file an engine loads behind a plain-file entry, or
    declare other bytes as the weights.
    """
    problems = []
    for record in manifest.files:
        if record.header_size is not None and not is_shard_path(record.path):
            problems.append(
                (record.path, "listed as a safetensors shard, but only *.safetensors files are shards")
            )
        elif record.header_size is None and is_shard_path(record.path) and record.path in entries:
            problems.append(
                (record.path, "a safetensors file listed as a plain file (its tensors are not listed)")
            )
    for path, layout in sorted(layouts.items()):
        tensors = manifest.shards().get(path)
        if not (_same_entries(tensors, layout) if tensors is not None else not layout.tensors):
            problems.append((path, "tensor entries do not match the file's header"))
    try:
        actual_weights = weight_files(entries, layouts)
        for path in sorted(set(actual_weights) ^ set(manifest.weights)):
            listed = (
                "listed as a weight file, but the folder's weights do not include it"
                if path in manifest.weights
                else ("holds weights an engine loads, but the manifest does not list it in weights")
            )
            problems.append((path, listed))
        if config_digests(entries) != dict(manifest.config):
            problems.append((MANIFEST_NAME, "records another config than the folder has"))
    except CkptpubError as error:
        problems.append((MANIFEST_NAME, str(error)))
    return problems


def _same_entries(listed: ShardTensors, layout: ShardLayout) -> bool:
    """Whether the manifest's entries for a shard are its header's, one for one.

    Compared as whole columns: a header read back unchanged lists its tensors in the
    order the manifest recorded them. Zero-size tensors share an offset, in whatever
    order a writer put them, so entries in another order are compared sorted.
    """
    names, dtypes, shapes, _ = listed.columns
    entries = list(zip(names, dtypes, shapes, listed.begins(), listed.ends, strict=True))
    header = list(layout.tensors)
    return entries == header or sorted(entries, key=_PLACE) == sorted(header, key=_PLACE)


#: Where an entry lies first, then what it is: equal for equal entries whatever their order.
_PLACE = itemgetter(3, 4, 0, 1, 2)


def weight_files(entries: Mapping[str, FolderEntry], layouts: Mapping[str, ShardLayout]) -> tuple[str, ...]:
    """The weight files, sorted; each tensor name must occur in only one of them."""
    index = entries.get(SAFETENSORS_INDEX_NAME)
    if index is not None:
        return tuple(_files_named_by_index(index, layouts))
    top_level = sorted(p for p in layouts if "/" not in p)
    _owners(top_level, layouts)
    return tuple(top_level)


def _owners(files: list[str], layouts: Mapping[str, ShardLayout]) -> dict[str, str]:
    """The file of ``files`` that holds each tensor name; ``CkptpubError`` for a name held by two."""
    owner = dict(chain.from_iterable(zip(map(_NAME, layouts[path].tensors), repeat(path)) for path in files))
    if len(owner) != sum(len(layouts[path].tensors) for path in files):
        seen: dict[str, str] = {}
        for path in files:
            for tensor in layouts[path].tensors:
                if tensor.name in seen:
                    raise CkptpubError(f"{path}: tensor {tensor.name!r} is also in {seen[tensor.name]}")
                seen[tensor.name] = path
    return owner


_NAME = attrgetter("name")


def config_digests(entries: Mapping[str, FolderEntry]) -> dict[str, str]:
    """Digest of the meaning of each top-level config file present."""
    digests = {}
    for name in CONFIG_FILES:
        entry = entries.get(name)
        if entry is not None:
            digests[name] = read_config(entry.real_path, name, entry.file_id)[1]
    return digests


def read_config(path: str, name: str, expect: FileId | None = None) -> tuple[dict[str, Any], str]:
    """A config file's JSON object and its meaning's digest, or ``CkptpubError``.

    ``expect`` is which file a folder scan saw (see ``sources.open_source``).
    """
    return config_meaning(read_small_file(path, MAX_CONFIG_BYTES, name, expect), name)


def _files_named_by_index(index: FolderEntry, layouts: Mapping[str, ShardLayout]) -> list[str]:
    """The files the index names, sorted, once each is a top-level shard holding the tensors mapped to it."""
    data = read_small_file(
        index.real_path, MAX_SAFETENSORS_INDEX_BYTES, SAFETENSORS_INDEX_NAME, index.file_id
    )
    # {"metadata": {...}, "weight_map": {...}}: an object of objects, like a safetensors header
    document = loads_two_level(data) or loads_strict(data, SAFETENSORS_INDEX_NAME, "index")
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not set(map(type, weight_map.values())) <= {str}:
        raise CkptpubError(f"{SAFETENSORS_INDEX_NAME}: weight_map must map tensor names to file names")
    files = sorted(set(weight_map.values()))
    for file in files:
        if "/" in file or file not in layouts:
            raise CkptpubError(f"{SAFETENSORS_INDEX_NAME}: names {file!r}, which is missing from the folder")
    owner = _owners(files, layouts)
    if not weight_map.items() <= owner.items():  # one lookup per entry, in C: 100k-tensor indexes
        absent = min(name for name, file in weight_map.items() if owner.get(name) != file)
        file = weight_map[absent]
        raise CkptpubError(
            f"{SAFETENSORS_INDEX_NAME}: maps tensor {absent!r} to {file}, which does not hold it"
        )
    return files
