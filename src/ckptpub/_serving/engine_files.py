"""The files an engine reads itself, and its weight shards, checked against the manifest.

Streaming verification covers every tensor, and a cache daemon holds exactly the
identity's tensors, but an engine also reads ``config.json``, ``generation_config.json``,
the tokenizer files and chat templates from the folder itself, on every start and
whichever path the weights take. A same-size edit of one of them (a changed
``rope_theta``, another chat template) would serve a different model under the
manifest's identity, and so would such a file added after publishing.

So every file whose name an engine may read (``engine_reads``) must be listed in the
manifest and is hashed whole, whatever its size, and a config's meaning must be the one
the identity was computed from (a forged manifest that recorded other config bytes is
refused too). Files are read by the core's one rule (``safe_open.read_inside``): no
symlink out of the folder, no folder behind a symlink, no FIFO blocked on, the size
bounded by the manifest's before a byte is read; ``ckptpub verify`` refuses the same
layouts. The weight shards are never opened here: the work is one directory listing
plus one open, ``fstat`` and read per engine file, the same for 16 shards or 163.

``check_shards_are_files`` and ``shard_problems`` are for the loading path only: before
an engine opens the shards itself, and after its reading failed, to name the shard.

A model in object storage (``s3://bucket/prefix``) is read by an engine from two places:
its small files from a local copy the engine pulled (vLLM keeps one per URL and never
cleans it: a file deleted from the bucket stays there), its shards from the bucket.
``check_engine_files(copy, manifest, copy_of=url)`` checks that copy against the
manifest read from the bucket, so a stale or altered pulled file is refused like a
changed one; the shard checks take the URL itself (objects are neither symlinks nor FIFOs;
their sizes and headers come from one listing and a ranged GET each).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from .._filesystem.objects import ObjectUrl, is_object_url, list_objects
from .._filesystem.safe_open import OpenError, kind_of, open_inside, read_inside, resolve_inside
from .._filesystem.sources import open_source, read_at
from .._format.digest import digest_bytes
from .._format.manifest import FileRecord, Manifest, config_meaning
from .._format.names import MANIFEST_NAME, SAFETENSORS_INDEX_NAME, TRAINER_STATE_NAME
from ..errors import CkptpubError
from .refusal import RefusedError

#: Names read by engines' config code and by transformers' tokenizer and processor loaders.
_EXACT_NAMES = frozenset({"merges.txt", "vocab.txt", "params.json", "tekken.json"})
_PREFIXES = (
    "tokenizer",
    "chat_template",
    "vocab",
    "special_tokens",
    "added_tokens",
    "spiece",
    "sentencepiece",
)
_SUFFIXES = (".json", ".jinja", ".model", ".tiktoken")
#: Not read by an engine: the manifest (read and validated on its own), the shard index (read only
#: on the disk path, whose shards stream verified anyway) and training state, ``ckptpub verify``'s business.
_NOT_READ = frozenset({MANIFEST_NAME, SAFETENSORS_INDEX_NAME, TRAINER_STATE_NAME})
#: Subfolder of extra chat templates that transformers lists and reads.
TEMPLATES_FOLDER = "additional_chat_templates"


def engine_reads(path: str) -> bool:
    """Whether an engine may read this '/'-separated path of a checkpoint folder."""
    folder, _, name = path.rpartition("/")
    if folder:
        return folder == TEMPLATES_FOLDER and name.endswith(".jinja")
    if name in _NOT_READ or name.endswith(".safetensors"):
        return False
    return name in _EXACT_NAMES or name.startswith(_PREFIXES) or name.endswith(_SUFFIXES)


class FileMismatchError(CkptpubError):
    """How a file differs from its manifest record; the message starts with the file's path."""


def read_published(folder: str, record: FileRecord, manifest: Manifest) -> bytes:
    """The bytes of the file ``record`` describes, once they are exactly the published ones.

    Read once, whole, by the core's rule (``read_inside``), never more than the recorded
    size; a config must also mean what the manifest's identity covers. Raises
    ``FileMismatchError`` otherwise.
    """
    path = record.path
    try:
        data = read_inside(folder, path, record.size, limit_name="size the manifest records")
    except OpenError as error:
        raise FileMismatchError(f"{path} is missing" if error.absent else str(error)) from None
    except CkptpubError as error:
        raise FileMismatchError(str(error)) from None
    if len(data) != record.size:
        raise FileMismatchError(f"{path} has {len(data)} bytes, the manifest says {record.size}")
    if digest_bytes(data) != record.digest:
        raise FileMismatchError(f"{path}: bytes differ from the manifest")
    if path in manifest.config and _config_meaning(path, data) != manifest.config[path]:
        raise FileMismatchError(f"{path}: the manifest records another config meaning (forged manifest?)")
    return data


#: ``read_weights_file`` reads this much at a time, and tells ``on_read`` after each.
READ_CHUNK_BYTES = 8 << 20


def _new_memory(size: int) -> memoryview:
    return memoryview(bytearray(size))


def read_weights_file(
    folder: str,
    record: FileRecord,
    allocate: Callable[[int], memoryview] = _new_memory,
    on_read: Callable[[int], None] | None = None,
) -> memoryview:
    """The whole file ``record`` describes, read once into writable memory (a loader's private copy).

    Opened by the core's rule (``open_inside``); its size must be the recorded one,
    checked with ``fstat`` before anything is allocated, so a manifest's number is never
    trusted alone; a file that changes size while it is read is refused. ``allocate``
    gives the memory, ``size`` writable bytes (a loader may reuse memory it owns);
    ``on_read`` is told how many bytes are in it after each chunk, so a caller can hash
    what has arrived while the rest is read. The bytes are not hashed here: the caller
    verifies what it hands on (``StreamVerifier``). Raises ``FileMismatchError``.
    """
    path = record.path
    try:
        fd, info = open_inside(folder, path)
    except OpenError as error:
        raise FileMismatchError(f"{path} is missing" if error.absent else str(error)) from None
    except CkptpubError as error:
        raise FileMismatchError(str(error)) from None
    try:
        if info.st_size != record.size:
            raise FileMismatchError(f"{path} has {info.st_size} bytes, the manifest says {record.size}")
        view, got = allocate(record.size), 0
        with os.fdopen(fd, "rb", closefd=False) as handle:
            while got < record.size and (count := handle.readinto(view[got : got + READ_CHUNK_BYTES])):
                got += count
                if on_read is not None:
                    on_read(got)
            if got != record.size or handle.read(1):
                raise FileMismatchError(f"{path} changed size while it was read")
        return view
    except OSError as error:
        raise FileMismatchError(f"{path} cannot be read ({error.strerror or error})") from None
    finally:
        os.close(fd)


def engine_file_problems(folder: str, manifest: Manifest) -> list[str]:
    """Human-readable differences between the folder's engine files and the manifest."""
    listed = {record.path: record for record in manifest.files if engine_reads(record.path)}
    problems = [
        f"{path} is not in the manifest, and an engine reads it"
        for path in _present_engine_files(folder)
        if path not in listed
    ]
    for _, record in sorted(listed.items()):
        try:
            read_published(folder, record, manifest)
        except FileMismatchError as problem:
            problems.append(str(problem))
    return problems


def check_engine_files(
    folder: str, manifest: Manifest, kind: str = "", *, copy_of: str | None = None
) -> None:
    """Refuse unless every file an engine reads is exactly as published.

    ``copy_of``: ``folder`` is the engine's local copy of the small files of that object-store
    prefix, whose manifest ``manifest`` is; the refusal names the prefix and the copy.
    """
    problems = engine_file_problems(folder, manifest)
    if not problems:
        return
    if copy_of is None:
        raise RefusedError.for_problems(folder, problems, hint=f"run `ckptpub verify {folder}`", kind=kind)
    raise RefusedError.for_problems(
        copy_of,
        [f"the engine's copy of its files ({folder}): {problem}" for problem in problems],
        hint=f"run `ckptpub verify {copy_of}`; a copy that is stale (a file deleted from the bucket "
        "stays in it) or altered is removed for the engine to pull the files again",
        kind=kind,
    )


def _present_engine_files(folder: str) -> list[str]:
    """Engine-read paths that exist in the folder, from one listing (two with extra templates)."""
    try:
        names = os.listdir(folder)
    except OSError as error:
        raise RefusedError(folder, f"cannot list it ({error.strerror or error})") from None
    paths = [name for name in names if engine_reads(name)]
    if TEMPLATES_FOLDER in names:
        try:
            templates = os.listdir(os.path.join(folder, TEMPLATES_FOLDER))
        except OSError:  # not a listable folder: a file by that name is not read as templates
            templates = []
        paths += [f"{TEMPLATES_FOLDER}/{name}" for name in templates if name.endswith(".jinja")]
    return sorted(paths)


def _config_meaning(path: str, data: bytes) -> str | None:
    """The config digest of ``data``; None for a config no manifest records.

    The core's one config reader (the one publish and verify use), so text that is not
    a JSON object or that canonical JSON cannot write (NaN, ``1e400``, duplicate keys,
    nesting too deep) has no meaning: a forged manifest may list such a config with
    matching bytes, and it must be refused like any other mismatch.
    """
    try:
        return config_meaning(data, path)[1]
    except CkptpubError:
        return None


def check_shards_are_files(folder: str) -> None:
    """Refuse unless every top-level ``*.safetensors`` is a regular file inside the folder.

    Engines open the shards with a blocking open that follows symlinks: a FIFO would
    hang the engine start, a symlink could read outside the folder. One listing (the
    entry types come with it) and a ``stat`` only for symlinks, on the disk path
    only: the daemon path touches no shard. Objects of an ``s3://`` prefix are neither:
    nothing to check, no request made.
    """
    if is_object_url(folder):
        return
    problems = []
    root = os.path.realpath(folder)
    with os.scandir(folder) as entries:
        for entry in entries:
            if not entry.name.endswith(".safetensors"):
                continue
            try:
                if entry.is_symlink():
                    mode = os.stat(resolve_inside(root, entry.path, entry.name)).st_mode
                else:
                    mode = entry.stat(follow_symlinks=False).st_mode
            except CkptpubError as error:
                problems.append(f"shard {error}")
                continue
            except OSError as error:
                problems.append(f"shard {entry.name} cannot be read ({error.strerror or error})")
                continue
            if not stat.S_ISREG(mode):
                problems.append(f"shard {entry.name}: {kind_of(mode)}, not a regular file")
    if problems:
        raise RefusedError.for_problems(folder, sorted(problems))


def shard_problems(folder: str, manifest: Manifest) -> list[str]:
    """Weight shards that are missing, of another size, or whose header differs from the manifest.

    Run only after an engine's reading failed: it opens every shard, which a successful
    load never needs.
    """
    if is_object_url(folder):
        return _object_shard_problems(folder, manifest)
    problems = []
    records = {record.path: record for record in manifest.files}
    for shard in manifest.weights:
        record = records[shard]
        try:
            fd, info = open_inside(folder, shard)
        except OpenError as error:
            problems.append(f"shard {shard} is missing" if error.absent else f"shard {error}")
            continue
        except CkptpubError as error:
            problems.append(f"shard {error}")
            continue
        try:
            header = os.pread(fd, record.header_size or 0, 0)
        except OSError as error:
            problems.append(f"shard {shard} cannot be read ({error.strerror or error})")
            continue
        finally:
            os.close(fd)
        if info.st_size != record.size:
            problems.append(f"shard {shard} has {info.st_size} bytes, the manifest says {record.size}")
        elif digest_bytes(header) != record.digest:
            problems.append(f"shard {shard}: its header differs from the manifest (damaged?)")
    return problems


def _object_shard_problems(url: str, manifest: Manifest) -> list[str]:
    """``shard_problems`` below an ``s3://`` prefix: one listing, then a ranged GET of each header."""
    prefix = ObjectUrl.parse(url)
    try:
        listed = {entry.path: entry for entry in list_objects(prefix)}
    except CkptpubError as error:
        return [f"the shards cannot be listed ({error})"]
    problems = []
    records = {record.path: record for record in manifest.files}
    for shard in manifest.weights:
        record, entry = records[shard], listed.get(shard)
        if entry is None:
            problems.append(f"shard {shard} is missing")
        elif entry.size != record.size:
            problems.append(f"shard {shard} has {entry.size} bytes, the manifest says {record.size}")
        else:
            try:
                source = open_source(str(prefix.child(shard)), shard, (entry.etag, entry.size))
                header = read_at(source, 0, record.header_size or 0)
            except CkptpubError as error:
                problems.append(f"shard {shard} cannot be read ({error})")
                continue
            if digest_bytes(header) != record.digest:
                problems.append(f"shard {shard}: its header differs from the manifest (damaged?)")
    return problems
