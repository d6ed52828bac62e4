"""Which files of a checkpoint folder count, and the rules that keep reads inside it.

Every regular file below the folder counts, except the manifest itself and the
temporary files ckptpub writes next to it (regular files only: a folder with such a
name counts with everything in it). Names are read as bytes and decoded as strict
UTF-8, so the same folder gives the same manifest in every locale. A symlink counts as the file it points
to only when that file is inside the folder, or is a blob of the cached model whose snapshot the
folder is (``safe_open.resolve_inside``); one that leaves the folder, loops, or points at
anything but a regular file makes the folder unusable rather than being skipped, since
skipping would let a manifest silently ignore part of a model.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import NamedTuple

from .._format.names import NOT_CONTENT, is_temp_name
from ..errors import CkptpubError
from .objects import ObjectUrl, is_object_url, list_objects
from .safe_open import FileId, resolve_inside

#: A folder with more files than this is refused rather than scanned without end.
MAX_FILES = 200_000


class FolderEntry(NamedTuple):
    """A file that counts: its '/'-separated path in the folder, where to open it, and its stat.

    An object below an ``s3://`` prefix is an entry too: ``real_path`` is its URL and
    ``signature`` its ``(etag, size)``.
    """

    path: str
    real_path: str
    size: int
    mode: int
    signature: tuple[int | str, ...]

    @property
    def file_id(self) -> FileId:
        """``(st_dev, st_ino)``, or an object's ``(etag, size)``: which file the scan saw, for the reader
        to check it reads that one."""
        return self.signature[0], self.signature[1]


def as_path(value: object, what: str) -> str:
    """A path argument of the public API as ``str``: ``str``, ``os.PathLike`` or ``bytes`` (decoded
    as the file system does); anything else is a ``CkptpubError``, never a ``TypeError``."""
    try:
        if not isinstance(value, str | bytes | os.PathLike):
            raise TypeError
        path = os.fsdecode(value)  # TypeError too when __fspath__ returns neither str nor bytes
    except TypeError:
        raise CkptpubError(
            f"{what}: expected a path (str, bytes or os.PathLike), got {type(value).__name__}"
        ) from None
    if not path or "\x00" in path:
        raise CkptpubError(f"{what}: {path!r} is not a usable path")
    return path


def absolute_location(path: str) -> str:
    """``path`` as a command shows it: a folder's absolute path; an ``s3://`` URL as given."""
    return path if is_object_url(path) else os.path.abspath(path)


def resolve_folder(folder: str | os.PathLike[str]) -> str:
    """The folder's real absolute path; refuse anything that is not a directory.

    An ``s3://`` prefix is returned in its normal form (no trailing slash); whether it
    holds anything is the listing's answer.
    """
    path = as_path(folder, "folder")
    if is_object_url(path):
        return str(ObjectUrl.parse(path))
    try:
        info = os.stat(path)
    except OSError as error:
        raise CkptpubError(f"{path}: {error.strerror or error}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise CkptpubError(f"{path}: not a folder")
    return os.path.realpath(path)


def scan_folder(root: str) -> list[FolderEntry]:
    """All files that count in the real folder (or ``s3://`` prefix) ``root``, sorted by path."""
    if is_object_url(root):
        return _scan_objects(ObjectUrl.parse(root))
    entries: list[FolderEntry] = []
    pending = [("", os.fsencode(root))]
    while pending:
        prefix, directory = pending.pop()
        try:
            with os.scandir(directory) as listing:
                children = list(listing)
        except OSError as error:
            raise CkptpubError(f"{prefix or '.'}: cannot list folder: {error.strerror or error}") from None
        for child in children:
            relative = prefix + _decode_name(prefix, child.name)
            try:
                is_dir = child.is_dir(follow_symlinks=False)
                is_file = child.is_file(follow_symlinks=False)
            except OSError as error:
                raise CkptpubError(f"{relative}: {error.strerror or error}") from None
            if not prefix and (relative in NOT_CONTENT or (is_file and is_temp_name(relative))):
                continue  # manifest and signature (checked by whoever reads them), our own temporary files
            if is_dir:
                pending.append((relative + "/", child.path))
                continue
            entries.append(_file_entry(root, relative, child))
            if len(entries) > MAX_FILES:
                raise CkptpubError(f"{root}: more than {MAX_FILES} files; not a checkpoint folder")
    entries.sort(key=lambda e: e.path)
    return entries


def signature(info: os.stat_result) -> tuple[int, ...]:
    """What must stay equal for a file to be the same bytes: identity, size and change times."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def first_changed(root: str, entries: list[FolderEntry]) -> FolderEntry | None:
    """The first of ``entries`` that is no longer the file (or object) the scan saw; None if none changed.

    A folder costs an ``lstat`` per file; a prefix one listing, not a request per object.
    """
    if is_object_url(root):
        now = {entry.path: entry.signature for entry in _scan_objects(ObjectUrl.parse(root))}
        return next((entry for entry in entries if now.get(entry.path) != entry.signature), None)
    for entry in entries:
        try:
            if signature(os.lstat(entry.real_path)) != entry.signature:
                return entry
        except OSError:
            return entry
    return None


def _scan_objects(prefix: ObjectUrl) -> list[FolderEntry]:
    """The objects that count below ``prefix``, by the rules a folder's files count (names, ckptpub's own)."""
    entries = []
    for item in list_objects(prefix):
        if "/" not in item.path and (item.path in NOT_CONTENT or is_temp_name(item.path)):
            continue
        check_name(item.path)
        url = str(prefix.child(item.path))
        entries.append(FolderEntry(item.path, url, item.size, 0o644, (item.etag, item.size)))
    entries.sort(key=lambda e: e.path)
    return entries


def _decode_name(prefix: str, name: bytes) -> str:
    """A file name as the manifest records it: its bytes as strict UTF-8, whatever the locale."""
    try:
        text = name.decode("utf-8")
    except UnicodeDecodeError:
        shown = prefix + name.decode("utf-8", "backslashreplace")
        raise CkptpubError(f"{shown!r}: file name is not valid UTF-8") from None
    return check_name(prefix + text)[len(prefix) :]


def check_name(path: str) -> str:
    """``path`` when a manifest can record it: no backslash or newline in it."""
    if "\\" in path or "\n" in path:
        raise CkptpubError(f"{path!r}: file names with backslashes or newlines are not supported")
    return path


def _file_entry(root: str, relative: str, child: os.DirEntry[bytes]) -> FolderEntry:
    real_path = os.fsdecode(child.path)
    try:
        if child.is_symlink():
            real_path = resolve_inside(root, real_path, relative)
            info = os.lstat(real_path)
        else:
            info = child.stat(follow_symlinks=False)
    except OSError as error:
        reason = "symlink loop" if error.errno == errno.ELOOP else (error.strerror or str(error))
        raise CkptpubError(f"{relative}: {reason}") from None
    if stat.S_ISLNK(info.st_mode):  # realpath stops resolving only at a loop (or a link made meanwhile)
        raise CkptpubError(f"{relative}: symlink loop")
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder behind a symlink" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise CkptpubError(f"{relative}: {kind}; not supported in a checkpoint folder")
    return FolderEntry(relative, real_path, info.st_size, stat.S_IMODE(info.st_mode), signature(info))
