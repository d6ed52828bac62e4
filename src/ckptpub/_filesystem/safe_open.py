"""Opening and reading a folder's files without following, blocking on, or mistaking what is there.

The one implementation of three rules every reader of an untrusted folder applies
(the core's readers, the vLLM plugin's, the preload supervisor's):

* **open** (``open_regular``): never follow a symlink in the last component
  (``O_NOFOLLOW``), never block on a FIFO or device (``O_NONBLOCK``; harmless for
  regular files), and check what was opened with ``fstat`` before a byte is read: a
  regular file and, when the folder scan saw it, the very same file (device and
  inode). A file swapped for a symlink, a FIFO or another file between the scan and
  the read is refused, not read.
* **bounded small-file read** (``read_bounded``): the size is checked against a limit
  before anything is read, and the read stops past it should the file grow; one
  ``open``, one ``fstat`` and (for a file that keeps its size) one ``read``. Only a
  file an operator names (a key, a certificate) may be read through a symlink
  (``follow_symlinks``), never a file of a checkpoint.
* **symlinks stay inside** (``resolve_inside``): a symlink counts as the file it
  points to only when that is inside the folder and not one of ckptpub's own files
  (the manifest, the signature, a temporary file), which publishing replaces, or,
  in a snapshot of the Hugging Face cache, a blob of that cached model
  (``hub_layout.is_cached_blob``).
  ``open_inside`` and ``read_inside`` open and read a file of a folder by that rule.
"""

from __future__ import annotations

import errno
import os
import stat

from .._format.names import MANIFEST_NAME, is_ckptpub_file
from ..errors import CkptpubError
from .hub_layout import is_cached_blob

#: Which file a folder scan saw: ``(st_dev, st_ino)``, or an object's ``(etag, size)`` (``scan.FolderEntry``).
FileId = tuple[int | str, int | str]

#: Flags for reading a file of an untrusted folder.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class OpenError(CkptpubError):
    """The ``open`` itself failed; ``errno`` says why (``ENOENT``: nothing there, ``ELOOP``: a symlink)."""

    def __init__(self, message: str, errno: int | None) -> None:
        super().__init__(message)
        self.errno = errno

    @property
    def absent(self) -> bool:
        """Nothing is at the path."""
        return self.errno == errno.ENOENT


def open_regular(
    path: str, display_name: str, expect: FileId | None = None, flags: int = READ_FLAGS
) -> tuple[int, os.stat_result]:
    """Open ``path`` (for reading, unless ``flags`` say otherwise); return the descriptor and its ``fstat``.

    ``expect`` is the ``(st_dev, st_ino)`` the folder scan saw; a different file
    at that path now is refused. ``flags`` must keep ``O_NONBLOCK``, and ``O_NOFOLLOW``
    for every file of a checkpoint (only a file the operator names, a key, may be a link).
    Raises ``CkptpubError`` naming ``display_name`` (``OpenError`` when the open failed).
    """
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as error:
        raise OpenError(f"{display_name}: {open_failure(error)}", error.errno) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CkptpubError(f"{display_name}: {kind_of(info.st_mode)}, not a regular file")
        if expect is not None and (info.st_dev, info.st_ino) != tuple(expect):
            raise CkptpubError(f"{display_name}: replaced by another file while the folder was read")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def open_failure(error: OSError) -> str:
    """Why an ``open`` with ``READ_FLAGS`` failed, in words."""
    if error.errno == errno.ELOOP:
        return "is a symlink (or a symlink loop); not opened"
    if error.errno == errno.ENXIO:  # a socket, or a FIFO with O_NONBLOCK semantics for writers
        return "a socket or special file, not a regular file"
    return f"cannot open: {error.strerror or error}"


def kind_of(mode: int) -> str:
    """A file type in words, for messages."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISLNK(mode):
        return "a symlink"
    return "a special file"


def read_bounded(
    path: str,
    limit: int,
    display_name: str,
    expect: FileId | None = None,
    *,
    limit_name: str = "limit for this file",
    follow_symlinks: bool = False,
) -> bytes:
    """Read a whole small regular file, refusing one larger than ``limit`` bytes before reading it.

    Opened as ``open_regular`` opens (no FIFO or device, never blocking; the file the scan
    saw). A symlink is refused unless ``follow_symlinks``, which is for files an operator
    names (a key, a certificate: often a link, as in a mounted secret), never for a
    checkpoint's own files. ``limit_name`` ends the message for a file over the limit
    (``manifest limit``).
    """
    flags = READ_FLAGS & ~os.O_NOFOLLOW if follow_symlinks else READ_FLAGS
    fd, info = open_regular(path, display_name, expect, flags)
    try:
        return _read_whole(fd, info.st_size, limit, display_name, limit_name)
    finally:
        os.close(fd)


def _read_whole(fd: int, size: int, limit: int, display_name: str, limit_name: str) -> bytes:
    """The file's bytes, ``size`` (``fstat``'s) checked against ``limit`` first: one ``read`` when the
    file keeps that size, and never more than ``limit`` bytes if it grows."""
    if size > limit:
        raise CkptpubError(f"{display_name}: {size} bytes is over the {limit}-byte {limit_name}")
    try:
        parts = [os.read(fd, size + 1)]
        total = len(parts[0])
        while total != size and parts[-1]:  # a short read, or the file changed size: read to its end
            parts.append(os.read(fd, max(1, limit + 1 - total)))
            total += len(parts[-1])
            if total > limit:
                raise CkptpubError(
                    f"{display_name}: grew past the {limit}-byte {limit_name} while being read"
                )
    except OSError as error:
        raise CkptpubError(f"{display_name}: cannot read: {error.strerror or error}") from None
    return b"".join(parts)


def resolve_inside(root: str, link: str, display_name: str) -> str:
    """Where the symlink ``link`` of the real folder ``root`` leads, if a symlink may lead there.

    Inside ``root`` (not ``root`` itself), and not the manifest, the signature or a
    temporary file at its top, which publishing replaces; or, for a snapshot of a
    model in the Hugging Face cache, a blob of that cached model
    (``hub_layout.is_cached_blob``). ``CkptpubError`` otherwise.
    """
    target = os.path.realpath(link)
    if is_cached_blob(root, target):
        return target
    if os.path.commonpath([root, target]) != root or target == root:
        raise CkptpubError(f"{display_name}: symlink points outside the checkpoint folder")
    if os.path.dirname(target) == root and is_ckptpub_file(os.path.basename(target)):
        raise CkptpubError(f"{display_name}: symlink points at {MANIFEST_NAME}, which publishing replaces")
    return target


def open_inside(folder: str, relative: str) -> tuple[int, os.stat_result]:
    """``open_regular`` of the file at the '/'-separated ``relative`` path of ``folder``, named by it.

    A symlink there is followed as ``resolve_inside`` allows (what publishing
    accepts), and only after the no-follow open met it, so the usual file costs one
    ``open`` and one ``fstat``. A path through a folder that is a symlink is refused,
    as a folder scan refuses it. The caller closes the descriptor.
    """
    parts = relative.split("/")
    path = os.path.join(folder, *parts)
    if len(parts) > 1:
        root = os.path.realpath(folder)
        if os.path.realpath(os.path.dirname(path)) != os.path.join(root, *parts[:-1]):
            raise CkptpubError(
                f"{relative}: in a folder behind a symlink; not supported in a checkpoint folder"
            )
    try:
        return open_regular(path, relative)
    except OpenError as error:
        if error.errno != errno.ELOOP:
            raise
    return open_regular(resolve_inside(os.path.realpath(folder), path, relative), relative)


def read_inside(folder: str, relative: str, limit: int, *, limit_name: str = "limit for this file") -> bytes:
    """``read_bounded`` of a file of ``folder`` opened by ``open_inside``: one open, fstat and read."""
    fd, info = open_inside(folder, relative)
    try:
        return _read_whole(fd, info.st_size, limit, relative, limit_name)
    finally:
        os.close(fd)
