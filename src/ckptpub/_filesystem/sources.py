"""A file of a checkpoint, in a folder or below an ``s3://`` prefix, opened for reading: one interface.

The readers that do not care where bytes live (the hashing engine, a shard's header,
a config, the manifest) open a ``Source`` here and call ``read_into``; which rules
apply is decided once, by the path: a local file is opened by ``safe_open``'s rule (no
symlink followed, no FIFO blocked on, the file the scan saw), an object by
``objects``' (ranged GETs of the version the listing saw).
"""

from __future__ import annotations

import errno
import os
from typing import Protocol

from ..errors import CkptpubError
from .objects import ObjectAbsentError, ObjectFile, ObjectUrl, is_object_url, open_object, read_small
from .safe_open import FileId, OpenError, open_regular, read_bounded


class Source(Protocol):
    """An opened file: its size when opened, and reads of its bytes at an offset."""

    @property
    def size(self) -> int: ...

    def read_into(self, view: memoryview, offset: int) -> int:
        """Read into ``view`` from ``offset``; how many bytes (at least one: a file that ends sooner is
        an error naming it)."""
        ...

    def close(self) -> None: ...


class LocalFile:
    """A regular file opened by ``safe_open.open_regular``; ``fd`` is kept for mapping it."""

    def __init__(self, path: str, display_name: str, expect: FileId | None) -> None:
        self.fd, info = open_regular(path, display_name, expect)
        self.size, self.display_name = info.st_size, display_name

    def read_into(self, view: memoryview, offset: int) -> int:
        try:
            got = os.preadv(self.fd, [view], offset)
        except OSError as error:
            raise CkptpubError(f"{self.display_name}: read failed: {error.strerror or error}") from None
        if got == 0:
            raise CkptpubError(f"{self.display_name}: file shrank while it was being read")
        return got

    def close(self) -> None:
        os.close(self.fd)


def open_source(path: str, display_name: str, expect: FileId | None = None) -> LocalFile | ObjectFile:
    """The file (or ``s3://`` object) at ``path``, as the scan saw it when ``expect`` is given."""
    if is_object_url(path):
        return open_object(ObjectUrl.parse(path), display_name, expect)
    return LocalFile(path, display_name, expect)


def read_at(source: Source, offset: int, length: int) -> bytes:
    """Exactly ``length`` bytes of ``source`` from ``offset`` (``CkptpubError`` if it ends sooner)."""
    buffer = bytearray(length)
    view, filled = memoryview(buffer), 0
    while filled < length:
        filled += source.read_into(view[filled:], offset + filled)
    return bytes(buffer)


def read_small_file(
    path: str,
    limit: int,
    display_name: str,
    expect: FileId | None = None,
    *,
    limit_name: str = "limit for this file",
) -> bytes:
    """A whole small file (or object), refused over ``limit`` bytes before it is read.

    ``OpenError`` with ``absent`` true when nothing is there, for a file and an object alike.
    """
    if not is_object_url(path):
        return read_bounded(path, limit, display_name, expect, limit_name=limit_name)
    etag = None if expect is None else str(expect[0])
    try:
        return read_small(ObjectUrl.parse(path), limit, display_name, etag, limit_name=limit_name)
    except ObjectAbsentError as error:
        raise OpenError(str(error), errno.ENOENT) from None
