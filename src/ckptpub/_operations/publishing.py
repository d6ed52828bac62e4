"""Build a manifest from a folder's bytes and write it atomically next to them.

Writing goes through ``jsonfiles.write_together`` (temporary files in the folder,
fsync, rename and a directory fsync), so a reader (or a crash) sees either no
manifest, the old one, or the complete new one; a signature is written with it,
under the folder's write lock (``jsonfiles.folder_lock``), so concurrent publishes
never pair one's manifest with another's signature. The folder's modification time
is restored afterwards because the Trainer's ``save_total_limit`` rotation orders
checkpoints by it.

Below an ``s3://`` prefix the manifest is written last with a conditional put
(``objects.put_object``): only if ``ckptpub.json`` is still what this publish saw
before it hashed (absent, or the same ETag), so of two publishers the second is
refused rather than interleaved, and a reader never sees a manifest before the
objects it lists (they were listed, and hashed, first). Each object's ETag and
version go into the provenance (``storage``), never into the identity, which is of
the bytes alone: the same model copied between a bucket and a folder keeps it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from .._filesystem.hub_cache import HUB_KEY, CachedModel, cached_model, locate
from .._filesystem.jsonfiles import folder_lock, write_together
from .._filesystem.model_files import config_digests, is_shard_path, read_layouts, weight_files
from .._filesystem.objects import ObjectUrl, is_object_url, list_objects, object_versions, put_object
from .._filesystem.read import read_manifest
from .._filesystem.scan import FolderEntry, as_path, first_changed, resolve_folder, scan_folder
from .._format.canonical import canonical_json
from .._format.digest import DIGEST_PREFIX
from .._format.manifest import MAX_MANIFEST_BYTES, Manifest, check_identity, identity_of
from .._format.names import MANIFEST_NAME, RUN_INDEX_NAME, SIGNATURE_NAME
from .._format.records import FileRecord
from .._format.regions import Entry, check_shapes, encode_regions, entries_of
from .._format.safetensors import ShardLayout
from .._hashing.engine import ProgressCallback, Span, check_file_hash, tensor_spans
from .._hashing.options import HashOptions, SpanHasher
from .._version import __version__
from ..errors import CkptpubError

if TYPE_CHECKING:
    from .._hashing.distributed import DistributedHasher
    from .signing import Signer, SigningKey

log = logging.getLogger("ckptpub")

#: Provenance nested deeper than this is refused (it is a record of facts, not a data store).
MAX_PROVENANCE_DEPTH = 64
#: Provenance longer than this (as canonical JSON) is refused, for the same reason; it also bounds
#: the work of checking a value from Python that shares its parts (``[x, x]`` nested 64 deep).
MAX_PROVENANCE_CHARS = 1 << 20
#: Provenance key of a manifest published in object storage: the prefix, and each object's ETag and version.
STORAGE_KEY = "storage"


def build_manifest(
    folder: str | os.PathLike[str],
    *,
    provenance: Mapping[str, Any] | None = None,
    threads: int | None = None,
    use_mmap: bool = True,
    on_progress: ProgressCallback | None = None,
    allow_no_weights: bool = False,
    allow_nested: bool = False,
    hasher: SpanHasher | None = None,
) -> Manifest:
    """Hash every tensor and file of ``folder`` and return its manifest, writing nothing.

    ``on_progress(done_bytes, total_bytes)`` is called as hashing advances.
    Raises ``CkptpubError`` for a malformed checkpoint, when a file changes while
    it is hashed (the manifest must describe bytes that were on disk together), and
    for what is probably the wrong folder: one with no weight files (an empty
    folder, a run folder; pass ``allow_no_weights=True`` for an FSDP or DeepSpeed
    layout) or one holding other checkpoints (``checkpoint-N`` folders, manifests,
    a run index; ``allow_nested=True`` to publish it anyway). ``hasher`` hashes instead of this
    process's threads (a ``distributed.DistributedHasher`` spreads the work over a job's ranks).
    """
    options = _Options.checked(
        provenance, threads, use_mmap, on_progress, allow_no_weights, allow_nested, hasher=hasher
    )
    return _build(resolve_folder(folder), options)[0]


@dataclass(frozen=True)
class _Options:
    """The keyword arguments of ``publish``/``build_manifest``, checked once at the API boundary."""

    provenance: Mapping[str, Any] | None
    hashing: HashOptions
    allow_no_weights: bool
    allow_nested: bool
    signer: Signer | None = None  # a loaded signing key: checked before anything is hashed
    sign_hash: str = "sha256"  # the whole-file digest the signature lists (engine.FILE_HASHES)

    @classmethod
    def checked(
        cls,
        provenance: Any,
        threads: Any,
        use_mmap: Any,
        on_progress: Any,
        allow_no_weights: Any,
        allow_nested: Any,
        sign: Any = None,
        sign_hash: Any = "sha256",
        hasher: Any = None,
    ) -> _Options:
        if provenance is not None and not hasattr(provenance, "items"):
            raise CkptpubError(
                f"provenance: expected a mapping of JSON data, got {type(provenance).__name__}"
            )
        hashing = HashOptions.checked(threads, use_mmap, on_progress, hasher)
        return cls(
            provenance=provenance,
            hashing=hashing,
            allow_no_weights=bool(allow_no_weights),
            allow_nested=bool(allow_nested),
            signer=None if sign is None else _load_signer(sign),
            sign_hash=check_file_hash(sign_hash, "sign_hash"),
        )


def _load_signer(sign: Any) -> Signer:
    from .signing import Signer  # model_signing only when signing

    return Signer.load(sign)


def _build(root: str, options: _Options) -> tuple[Manifest, list[FolderEntry], list[str]]:
    """The manifest, the files it lists, and (when signing) the ``sign_hash`` digest of each, in order."""
    entries = scan_folder(root)
    if not options.allow_nested:
        _refuse_nested_checkpoints(root, entries)
    by_path = {e.path: e for e in entries}
    layouts = {}
    for path, layout in read_layouts([e for e in entries if is_shard_path(e.path)]).items():
        if isinstance(layout, CkptpubError):
            raise layout
        layouts[path] = layout
    for path, layout in layouts.items():
        check_shapes(layout.tensors, path)
        if layout.header_size + (layout.tensors[-1].end if layout.tensors else 0) != by_path[path].size:
            raise CkptpubError(f"{path}: changed size while its header was read")
    weights = weight_files(by_path, layouts)
    if not weights and not options.allow_no_weights:
        what = "is empty" if not entries else "has no weight files (no *.safetensors at its top level)"
        raise CkptpubError(
            f"{root}: {what}, so it is probably not a model checkpoint; "
            "publish the checkpoint folder itself, "
            f"or pass --allow-no-weights (allow_no_weights=True) for a layout without safetensors weights"
        )
    config = config_digests(by_path)
    if is_object_url(root):
        provenance = _provenance(options.provenance, None, _storage_record(root, entries))
    else:
        provenance = _provenance(options.provenance, cached_model(root))
    spans = list(_spans(entries, layouts))
    if options.signer is not None:  # a signature lists each whole file's digest: from the same reads
        span_digests, file_digests = options.hashing.file_digests(spans, options.sign_hash)
    else:
        span_digests, file_digests = options.hashing.span_digests(spans), []
    digests = iter(span_digests)
    changed = first_changed(root, entries)
    if changed is not None:
        raise CkptpubError(
            f"{changed.path}: changed while it was being hashed; publish again once it is complete"
        )
    files: list[FileRecord] = []
    per_file: dict[str, list[Entry]] = {}
    for entry in entries:
        shard = layouts.get(entry.path)
        files.append(FileRecord(entry.path, entry.size, next(digests), shard.header_size if shard else None))
        if shard is not None:
            per_file[entry.path] = entries_of(shard.tensors, digests)
    regions = encode_regions(files, weights, per_file)
    identity = identity_of(regions, files, weights, config)
    manifest = Manifest.lazy(identity, regions, tuple(files), weights, config, provenance)
    return manifest, entries, file_digests


def _refuse_nested_checkpoints(root: str, entries: list[FolderEntry]) -> None:
    """Refuse a folder that holds checkpoints (a run folder): one manifest would hide them."""
    for entry in entries:
        parts = entry.path.split("/")
        nested = (
            parts[-1] == MANIFEST_NAME
            or entry.path == RUN_INDEX_NAME
            or (len(parts) > 1 and _is_checkpoint_name(parts[0]))
        )
        if nested:
            raise CkptpubError(
                f"{root}: holds other checkpoints ({entry.path}); "
                f"it looks like a training run's folder. Publish each "
                f"checkpoint folder instead, or pass --allow-nested (allow_nested=True) to publish it as one"
            )


def _is_checkpoint_name(name: str) -> bool:
    """``checkpoint-10``, ``checkpoint_3``: what the Trainer and accelerate name a checkpoint folder."""
    head, _, number = name.replace("_", "-").partition("-")
    return head == "checkpoint" and number.isascii() and number.isdigit()


def publish(
    folder: str | os.PathLike[str],
    *,
    provenance: Mapping[str, Any] | None = None,
    threads: int | None = None,
    use_mmap: bool = True,
    on_progress: ProgressCallback | None = None,
    allow_no_weights: bool = False,
    allow_nested: bool = False,
    base: str | os.PathLike[str] | None = None,
    adapter: str | os.PathLike[str] | None = None,
    sign: str | os.PathLike[str] | SigningKey | Signer | None = None,
    sign_hash: str = "sha256",
    hasher: SpanHasher | None = None,
) -> Manifest:
    """Build the manifest of ``folder`` and write it to ``folder/ckptpub.json`` atomically.

    ``sign`` (a private key's path, or a ``ckptpub.signing.SigningKey`` for a
    certificate) also writes ``folder/model.sig``, a signature over every file and
    the manifest in model_signing's format (``pip install ckptpub[sign]``); the key is
    loaded before anything is hashed or written. ``sign_hash`` is the file digest it
    lists: ``"sha256"``, which the ``model_signing verify`` command checks, or
    ``"blake3"``, which costs a fraction of it and verifies with model_signing's Python
    API and ``ckptpub verify --public-key`` (``docs/security.md`` says which to choose).

    ``base`` and ``adapter`` record lineage for a merged or converted model: each
    is a published checkpoint folder, a published model's hub id in the Hugging Face
    cache (``org/name``, ``org/name@REVISION``) or an identity (``blake3:<64 hex>``),
    recorded as ``provenance.base_identity`` / ``provenance.adapter_identity`` (they
    override those keys of ``provenance``), and a cached model also by its hub id and
    commit (``base_hub`` / ``adapter_hub``). A folder without a manifest is refused:
    publish the base first, so the record names bytes someone can check.

    ``folder`` may be a snapshot in the Hugging Face cache: its files are symlinks
    into the cached repository's blobs, which are read and never changed; the manifest
    then also records the model's hub id and commit (``provenance.hub``).

    Refuses (``CkptpubError``) what ``build_manifest`` refuses, and then nothing is
    written. Once the manifest landed, the publish has happened: a folder whose
    modification time cannot be restored afterwards (one the publisher does not own)
    is a warning on the ``ckptpub`` logger, not an error.

    >>> manifest = publish("runs/demo/checkpoint-20")  # doctest: +SKIP
    >>> manifest.identity  # doctest: +SKIP
    'blake3:4f1c...'
    """
    provenance = _with_lineage(provenance, base=base, adapter=adapter)
    options = _Options.checked(
        provenance,
        threads,
        use_mmap,
        on_progress,
        allow_no_weights,
        allow_nested,
        sign,
        sign_hash,
        hasher=hasher,
    )
    root = resolve_folder(folder)
    if is_object_url(root):
        return _publish_objects(ObjectUrl.parse(root), options)
    try:
        before = os.stat(root)
    except OSError as error:
        raise CkptpubError(f"{root}: {error.strerror or error}") from None
    manifest, entries, file_digests = _build(root, options)
    files = [(os.path.join(root, MANIFEST_NAME), _manifest_bytes(manifest))]
    if options.signer is not None:  # signed before anything is written; the manifest lands last
        files.insert(
            0,
            (
                os.path.join(root, SIGNATURE_NAME),
                _signature(root, manifest, entries, file_digests, options.signer, options.sign_hash),
            ),
        )
    try:
        with folder_lock(root):  # another publish of this folder never pairs its manifest with our signature
            write_together(files, _file_mode(entries))
    finally:  # a failed write created and removed a temp file: the folder's mtime is restored then too
        problem = _restore_mtime(root, before)
    if problem is not None:
        log.warning("ckptpub: %s: published %s (a valid manifest), but %s", root, MANIFEST_NAME, problem)
    return manifest


def _publish_objects(prefix: ObjectUrl, options: _Options) -> Manifest:
    """``publish`` of an ``s3://`` prefix: hashed from the bucket, the manifest put last, conditionally."""
    if options.signer is not None:
        raise CkptpubError(f"{prefix}: signing needs a local folder; publish and sign it there, then upload")
    manifest_url = prefix.child(MANIFEST_NAME)
    # The manifest as it is before hashing (its ETag, or none), from a listing: a refused request's
    # answer names why (AccessDenied, InvalidAccessKeyId), where a HEAD's has no body to say it.
    listed = {entry.path: entry.etag for entry in list_objects(prefix)}
    replaces = listed.get(MANIFEST_NAME)
    manifest = _build(str(prefix), options)[0]
    put_object(manifest_url, _manifest_bytes(manifest), replaces=replaces, display_name=str(manifest_url))
    return manifest


def _storage_record(root: str, entries: list[FolderEntry]) -> dict[str, Any]:
    """Where the objects hashed live, and which version of each (``{path: {"etag", "version"}}``)."""
    versions = object_versions(ObjectUrl.parse(root))
    objects = {e.path: {"etag": e.signature[0], "version": versions.get(e.path, "null")} for e in entries}
    return {"url": root, "objects": objects}


def _signature(
    root: str,
    manifest: Manifest,
    entries: list[FolderEntry],
    file_digests: list[str],
    signer: Signer,
    sign_hash: str,
) -> bytes:
    """``model.sig``'s bytes for the manifest about to be written (``sign_hash`` digests of its files)."""
    from .signing import signature_for

    symlinks = any(e.real_path != os.path.join(root, *e.path.split("/")) for e in entries)
    by_path = dict(zip((e.path for e in entries), file_digests, strict=True))
    return signature_for(root, manifest, by_path, signer, sign_hash=sign_hash, allow_symlinks=symlinks)


def _with_lineage(provenance: Any, **links: Any) -> Any:
    """``provenance`` plus ``<name>_identity`` for each link given (a published folder or an identity)."""
    given = {name: value for name, value in links.items() if value is not None}
    if not given:
        return provenance
    if provenance is not None and not hasattr(provenance, "items"):
        return provenance  # _Options.checked refuses it with its usual message
    merged = dict(provenance or {})
    for name, value in given.items():
        identity, cached = lineage_of(value, name)
        merged[f"{name}_identity"] = identity
        if cached is not None:  # ``base_hub``: the base by its hub id and commit
            merged[f"{name}_hub"] = cached.record()
    return merged


def lineage_of(value: Any, what: str) -> tuple[str, CachedModel | None]:
    """The identity of ``value`` (an identity, a published folder, or a published model's hub id), and
    the cached model it is when it is one (so a record can name it by hub id and commit)."""
    if isinstance(value, str) and value.startswith(DIGEST_PREFIX):
        return check_identity(value, what), None
    path = as_path(value, what)
    try:
        folder = locate(path)
        return read_manifest(folder).identity, cached_model(os.path.realpath(folder))
    except CkptpubError as error:
        raise CkptpubError(f"{what}: {error} (publish it first: ckptpub publish {path})") from None


def _manifest_bytes(manifest: Manifest) -> bytes:
    """What ``ckptpub.json`` will hold; refused before anything is written when readers would refuse it."""
    data = manifest.to_json()
    if len(data) > MAX_MANIFEST_BYTES:
        raise CkptpubError(
            f"{MANIFEST_NAME}: {len(data)} bytes would be over the {MAX_MANIFEST_BYTES}-byte manifest "
            f"limit readers accept; not written"
        )
    return data


def _spans(entries: list[FolderEntry], layouts: Mapping[str, ShardLayout]) -> Iterator[Span]:
    """Per file: the whole file, or for a shard its header then each tensor (the records' order)."""
    for entry in entries:
        layout = layouts.get(entry.path)
        if layout is None:
            yield Span(entry.real_path, 0, entry.size, entry.path, entry.file_id)
            continue
        yield Span(entry.real_path, 0, layout.header_size, entry.path, entry.file_id)
        places = (map(_NAME, layout.tensors), map(_BEGIN, layout.tensors), map(_END, layout.tensors))
        yield from tensor_spans(entry.real_path, entry.path, entry.file_id, layout.header_size, places)


_NAME, _BEGIN, _END = attrgetter("name"), attrgetter("begin"), attrgetter("end")


def _provenance(
    extra: Mapping[str, Any] | None, cached: CachedModel | None, storage: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The caller's provenance, with ckptpub's version, the time and, for a model in the Hugging Face
    cache, its hub id and commit (``hub``); for an ``s3://`` prefix, its objects' versions (``storage``)."""
    try:
        provenance: dict[str, Any] = dict(extra or {})
        if cached is not None:
            provenance.setdefault(HUB_KEY, cached.record())
        if storage is not None:
            provenance[STORAGE_KEY] = storage
        producer = dict(provenance.get("producer") or {})
        producer["ckptpub"] = __version__
        provenance["producer"] = producer
        provenance.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        canonical_json(provenance, max_chars=MAX_PROVENANCE_CHARS)  # TypeError/ValueError: not JSON data
    except (TypeError, ValueError) as error:
        raise CkptpubError(f"provenance: not plain JSON data ({error})") from None
    if _depth(provenance) > MAX_PROVENANCE_DEPTH:  # readers' parsers stop near 1000; stay far from it
        raise CkptpubError(f"provenance: nested more than {MAX_PROVENANCE_DEPTH} levels deep")
    return provenance


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in ``value`` (iteratively: any depth)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, level = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            pending.extend((child, level + 1) for child in children)
    return deepest


def _file_mode(entries: list[FolderEntry]) -> int:
    """Permissions no wider than the checkpoint's own files: the bits every file of it has."""
    mode = 0o666
    for entry in entries:
        mode &= entry.mode
    return mode & 0o666 or 0o600


def _restore_mtime(root: str, before: os.stat_result) -> str | None:
    """Put the folder's times back; what went wrong, in words, or None."""
    try:
        os.utime(root, ns=(before.st_atime_ns, before.st_mtime_ns))
    except FileNotFoundError:  # rotated or deleted meanwhile
        return "the folder vanished while its manifest was written"
    except OSError as error:
        return f"the folder's modification time could not be restored: {error.strerror or error}"
    return None


def publish_on_ranks(folder: str | os.PathLike[str], hasher: DistributedHasher, **options: Any) -> Manifest:
    """``publish`` on rank 0 of the hasher's group, ``build_manifest`` (nothing written) on the others.

    Every rank of the group calls it with the same folder (as each rank sees it) and
    options; all hash together, and rank 0's manifest is the one a single process
    would write. ``base``/``adapter`` are resolved, and ``sign`` signs, on rank 0 only
    (the other ranks compute the ``sign_hash`` digests of their files for that signature).
    """
    with hasher.taking_part():
        if hasher.rank == 0:
            return publish(folder, hasher=hasher, **options)
        for rank_0_only in ("base", "adapter", "sign", "sign_hash"):
            options.pop(rank_0_only, None)
        return build_manifest(folder, hasher=hasher, **options)
