"""Reading a checkpoint's files on an engine's start path: inside the folder, never blocking.

The engine-file check and the shard diagnosis read files an attacker may have
swapped: the open never follows a symlink in its last component and never blocks
on a FIFO, and what was opened must be a regular file. A symlink is followed only
to a file inside the folder (or, for a model in the Hugging Face cache, to its blobs),
the rule ``ckptpub publish`` applies, so a folder that
published is not refused here for the same layout. The happy path costs one open,
one ``fstat`` and one read (two for a whole file: the second sees its end); symlinks
are resolved only when the open says it met one.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
from collections.abc import Iterator

import ckptpub
from ckptpub.integration import resolve_inside as follow_link

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnreadableError(Exception):
    """Why a file of the folder cannot be read; the message completes "<path> ..."."""


def resolve_inside(folder: str, path: str) -> str:
    """Where the symlink ``path`` of ``folder`` leads, if publishing follows it there (the core's rule:
    inside the folder, or into the blobs of the cached model whose snapshot the folder is)."""
    try:
        return follow_link(os.path.realpath(folder), os.path.join(folder, path), path)
    except ckptpub.CkptpubError:
        raise UnreadableError("is a symlink out of the folder") from None


def read_prefix(folder: str, path: str, limit: int) -> tuple[bytes, int]:
    """Up to ``limit`` bytes of the regular file ``path`` of ``folder``, and the file's size."""
    with _regular_file(folder, path) as (handle, size):
        return handle.read(limit), size


def read_whole(folder: str, path: str, size: int) -> bytearray:
    """The regular file ``path`` of ``folder``, read once into writable memory, if it has ``size`` bytes.

    The size is checked with ``fstat`` before anything is allocated, so a manifest's
    number is never trusted alone; a file that changes size while it is read is refused.
    """
    with _regular_file(folder, path) as (handle, actual):
        if actual != size:
            raise UnreadableError(f"has {actual} bytes, the manifest says {size}")
        data = bytearray(size)
        view, got = memoryview(data), 0
        while got < size and (count := handle.readinto(view[got:])):
            got += count
        if got != size or handle.read(1):
            raise UnreadableError("changed size while it was read")
        return data


@contextlib.contextmanager
def _regular_file(folder: str, path: str) -> Iterator[tuple[io.BufferedReader, int]]:
    """A read handle on the regular file ``path`` of ``folder``, and its size."""
    fd = _open_inside(folder, path)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableError("is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            yield handle, info.st_size
    except OSError as error:
        raise UnreadableError(f"cannot be read ({error.strerror or error})") from None
    finally:
        os.close(fd)


def _open_inside(folder: str, path: str) -> int:
    try:
        try:
            return os.open(os.path.join(folder, path), _READ_FLAGS)
        except OSError as error:
            if error.errno != errno.ELOOP:
                raise
        return os.open(resolve_inside(folder, path), _READ_FLAGS)
    except OSError as error:
        if error.errno == errno.ENOENT:
            raise UnreadableError("is missing") from None
        raise UnreadableError(f"cannot be read ({error.strerror or error})") from None
