"""Build a manifest from a folder's bytes and write it atomically next to them.

Writing goes through a temporary file in the folder, fsync, rename and a directory
fsync, so a reader (or a crash) sees either no manifest, the old one, or the
complete new one. The folder's modification time is restored afterwards because
the Trainer's ``save_total_limit`` rotation orders checkpoints by it.
"""

from __future__ import annotations

import os
import time

from . import __version__
from .canonical import canonical_json
from .errors import CkptpubError
from .hashing import Span, hash_spans
from .manifest import MANIFEST_NAME, FileRecord, Manifest, TensorRecord, compute_identity
from .model_files import config_digests, weight_files
from .safetensors import ShardLayout, read_layout
from .scan import TEMP_PREFIX, TEMP_SUFFIX, FolderEntry, resolve_folder, restat, scan_folder

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see records.py)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from .hashing import ProgressCallback


def build_manifest(
    folder: str | os.PathLike[str],
    *,
    provenance: Mapping[str, Any] | None = None,
    threads: int | None = None,
    use_mmap: bool = True,
    on_progress: ProgressCallback | None = None,
) -> Manifest:
    """Hash every tensor and file of ``folder`` and return its manifest, writing nothing.

    ``on_progress(done_bytes, total_bytes)`` is called as hashing advances.
    Raises ``CkptpubError`` for a malformed checkpoint, or when a file changes
    while it is hashed (the manifest must describe bytes that were on disk together).
    """
    return _build(resolve_folder(folder), provenance, threads, use_mmap, on_progress)[0]


def _build(
    root: str,
    provenance: Mapping[str, Any] | None,
    threads: int | None,
    use_mmap: bool,
    on_progress: ProgressCallback | None,
) -> tuple[Manifest, list[FolderEntry]]:
    entries = scan_folder(root)
    by_path = {e.path: e for e in entries}
    layouts = {e.path: read_layout(e.real_path, e.path) for e in entries if e.path.endswith(".safetensors")}
    for path, layout in layouts.items():
        if layout.header_size + (layout.tensors[-1].end if layout.tensors else 0) != by_path[path].size:
            raise CkptpubError(f"{path}: changed size while its header was read")
    weights = weight_files(by_path, layouts)
    config = config_digests(by_path)
    spans = list(_spans(entries, layouts))
    digests = iter(hash_spans(spans, threads=threads, use_mmap=use_mmap, on_progress=on_progress))
    for entry in entries:
        if restat(entry) != entry.signature:
            raise CkptpubError(f"{entry.path}: changed while it was being hashed; publish again once it is complete")
    files, tensors = [], []
    for entry in entries:
        layout = layouts.get(entry.path)
        files.append(FileRecord(entry.path, entry.size, next(digests), layout.header_size if layout else None))
        for t in layout.tensors if layout else ():
            tensors.append(TensorRecord(t.name, t.dtype, t.shape, entry.path, (t.begin, t.end), next(digests)))
    identity = compute_identity(tuple(tensors), tuple(files), weights, config)
    return Manifest(identity, tuple(tensors), tuple(files), weights, config, _provenance(provenance)), entries


def publish(
    folder: str | os.PathLike[str],
    *,
    provenance: Mapping[str, Any] | None = None,
    threads: int | None = None,
    use_mmap: bool = True,
    on_progress: ProgressCallback | None = None,
) -> Manifest:
    """Build the manifest of ``folder`` and write it to ``folder/ckptpub.json`` atomically.

    >>> manifest = publish("runs/demo/checkpoint-20")  # doctest: +SKIP
    >>> manifest.identity  # doctest: +SKIP
    'blake3:4f1c...'
    """
    root = resolve_folder(folder)
    before = os.stat(root)
    manifest, entries = _build(root, provenance, threads, use_mmap, on_progress)
    try:
        write_manifest(root, manifest, _file_mode(entries))
    finally:  # a failed write created and removed a temp file: the folder's mtime is restored then too
        restored = _restore_mtime(root, before)
    if not restored:
        raise CkptpubError(f"{root}: folder vanished while its manifest was written")
    return manifest


def write_manifest(root: str, manifest: Manifest, mode: int) -> None:
    """Write ``manifest`` into the real folder ``root``: temp file, fsync, rename, fsync the folder."""
    target = os.path.join(root, MANIFEST_NAME)
    temp = os.path.join(root, f"{TEMP_PREFIX}{os.urandom(8).hex()}{TEMP_SUFFIX}")
    data = manifest.to_json()
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as error:
        raise CkptpubError(f"{MANIFEST_NAME}: cannot write in {root}: {error.strerror or error}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
        _fsync_folder(root)
    except OSError as error:
        _remove_quietly(temp)
        raise CkptpubError(f"{MANIFEST_NAME}: cannot write in {root}: {error.strerror or error}") from None
    except BaseException:
        _remove_quietly(temp)
        raise


def _spans(entries: list[FolderEntry], layouts: Mapping[str, ShardLayout]):
    """Per file: the whole file, or for a shard its header then each tensor (the order records are built in)."""
    for entry in entries:
        layout = layouts.get(entry.path)
        if layout is None:
            yield Span(entry.real_path, 0, entry.size, entry.path)
            continue
        yield Span(entry.real_path, 0, layout.header_size, entry.path)
        base = layout.header_size
        for t in layout.tensors:
            yield Span(entry.real_path, base + t.begin, base + t.end, f"{entry.path}: tensor {t.name!r}")


def _provenance(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    provenance: dict[str, Any] = dict(extra or {})
    producer = dict(provenance.get("producer") or {})
    producer["ckptpub"] = __version__
    provenance["producer"] = producer
    provenance.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    try:
        canonical_json(provenance)
    except (TypeError, ValueError) as error:
        raise CkptpubError(f"provenance: not plain JSON data ({error})") from None
    return provenance


def _file_mode(entries: list[FolderEntry]) -> int:
    """Permissions no wider than the checkpoint's own files: the bits every file of it has."""
    mode = 0o666
    for entry in entries:
        mode &= entry.mode
    return mode & 0o666 or 0o600


def _restore_mtime(root: str, before: os.stat_result) -> bool:
    try:
        os.utime(root, ns=(before.st_atime_ns, before.st_mtime_ns))
    except FileNotFoundError:  # rotated or deleted meanwhile: the caller says so
        return False
    return True


def _fsync_folder(root: str) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
