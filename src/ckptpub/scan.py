"""Which files of a checkpoint folder count, and the rules that keep reads inside it.

Every regular file below the folder counts, except the manifest itself and the
temporary files ckptpub writes next to it. A symlink counts as the file it points
to only when that file is inside the folder; one that leaves the folder, loops,
or points at anything but a regular file makes the folder unusable rather than
being skipped, since skipping would let a manifest silently ignore part of a model.
"""

from __future__ import annotations

import errno
import os
import stat

from .errors import CkptpubError
from .manifest import MANIFEST_NAME
from .records import NamedTuple

#: Prefix and suffix of the temporary files an atomic manifest write uses.
TEMP_PREFIX = "." + MANIFEST_NAME + "."
TEMP_SUFFIX = ".tmp"
#: A folder with more files than this is refused rather than scanned without end.
MAX_FILES = 200_000


class FolderEntry(NamedTuple):
    """A file that counts: its '/'-separated path in the folder, where to open it, and its stat."""

    path: str
    real_path: str
    size: int
    mode: int
    signature: tuple[int, ...]


def resolve_folder(folder: str | os.PathLike[str]) -> str:
    """The folder's real absolute path; refuse anything that is not a directory."""
    path = os.fspath(folder)
    try:
        info = os.stat(path)
    except OSError as error:
        raise CkptpubError(f"{path}: {error.strerror or error}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise CkptpubError(f"{path}: not a folder")
    return os.path.realpath(path)


def is_ckptpub_file(name: str) -> bool:
    """True for the manifest and ckptpub's own temporary files (top level only)."""
    return name == MANIFEST_NAME or (name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX))


def scan_folder(root: str) -> list[FolderEntry]:
    """All files that count in the real folder ``root``, sorted by path."""
    entries: list[FolderEntry] = []
    pending = [("", root)]
    while pending:
        prefix, directory = pending.pop()
        try:
            children = list(os.scandir(directory))
        except OSError as error:
            raise CkptpubError(f"{prefix or '.'}: cannot list folder: {error.strerror or error}") from None
        for child in children:
            relative = prefix + child.name
            _check_name(relative)
            if not prefix and is_ckptpub_file(child.name):
                continue
            if child.is_dir(follow_symlinks=False):
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


def restat(entry: FolderEntry) -> tuple[int, ...] | None:
    """The entry's signature now, or None if it is gone."""
    try:
        return signature(os.stat(entry.real_path))
    except OSError:
        return None


def _check_name(relative: str) -> None:
    try:
        relative.encode("utf-8")
    except UnicodeEncodeError:
        raise CkptpubError(f"{relative!r}: file name is not valid UTF-8") from None
    if "\\" in relative or "\n" in relative:
        raise CkptpubError(f"{relative!r}: file names with backslashes or newlines are not supported")


def _file_entry(root: str, relative: str, child: os.DirEntry) -> FolderEntry:
    real_path = child.path
    try:
        if child.is_symlink():
            real_path = os.path.realpath(child.path)
            if os.path.commonpath([root, real_path]) != root or real_path == root:
                raise CkptpubError(f"{relative}: symlink points outside the checkpoint folder")
            info = os.stat(real_path)
        else:
            info = child.stat(follow_symlinks=False)
    except OSError as error:
        reason = "symlink loop" if error.errno == errno.ELOOP else (error.strerror or str(error))
        raise CkptpubError(f"{relative}: {reason}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder behind a symlink" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise CkptpubError(f"{relative}: {kind}; not supported in a checkpoint folder")
    return FolderEntry(relative, real_path, info.st_size, stat.S_IMODE(info.st_mode), signature(info))
