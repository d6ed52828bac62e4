"""Opening a checkpoint's files without following, blocking on, or mistaking what is there.

Every file ckptpub reads from a checkpoint goes through ``open_regular``: the open
never follows a symlink in its last component (``O_NOFOLLOW``), never blocks on a
FIFO or device (``O_NONBLOCK``; harmless for regular files), and what was opened is
checked with ``fstat`` before a byte is read: it must be a regular file and, when
the folder scan saw it, the very same file (device and inode). So a file swapped
for a symlink out of the folder, a FIFO or another file between the scan and the
read is refused, not read.
"""

from __future__ import annotations

import errno
import os
import stat

from ..errors import CkptpubError

#: Flags for reading a file of an untrusted folder.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_regular(
    path: str, display_name: str, expect: tuple[int, int] | None = None, flags: int = READ_FLAGS
) -> tuple[int, os.stat_result]:
    """Open ``path`` (for reading, unless ``flags`` say otherwise); return the descriptor and its ``fstat``.

    ``expect`` is the ``(st_dev, st_ino)`` the folder scan saw; a different file
    at that path now is refused. ``flags`` must keep ``O_NOFOLLOW|O_NONBLOCK``.
    Raises ``CkptpubError`` naming ``display_name``.
    """
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as error:
        raise CkptpubError(f"{display_name}: {open_failure(error)}") from None
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


def read_bounded(path: str, limit: int, display_name: str, expect: tuple[int, int] | None = None) -> bytes:
    """Read a whole small regular file, refusing one larger than ``limit`` bytes before reading it.

    Opened as ``open_regular`` opens (no symlink, no FIFO, the file the scan saw).
    """
    fd, info = open_regular(path, display_name, expect)
    try:
        with os.fdopen(fd, "rb") as handle:
            size = info.st_size
            if size > limit:
                raise CkptpubError(
                    f"{display_name}: {size} bytes is over the {limit}-byte limit for this file"
                )
            data = handle.read(limit + 1)
    except OSError as error:
        raise CkptpubError(f"{display_name}: cannot read: {error.strerror or error}") from None
    if len(data) > limit:
        raise CkptpubError(f"{display_name}: grew past the {limit}-byte limit while being read")
    return data
