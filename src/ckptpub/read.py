"""Reading a manifest: one small, bounded, plain file and nothing else of the checkpoint.

A folder's manifest is read with one ``open`` (``O_NOFOLLOW|O_NONBLOCK``), one
``fstat`` and one ``read``: callers on an engine's start path (the vLLM plugin's
cache key) depend on that being O(1) filesystem requests, and a FIFO, folder or
symlink named ``ckptpub.json`` is refused without ever blocking or being followed.
"""

from __future__ import annotations

import errno
import os
import stat

from .errors import CkptpubError, NoManifestError
from .manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest, parse_manifest
from .safe_open import READ_FLAGS, kind_of, open_failure
from .scan import as_path


def read_manifest(location: str | os.PathLike[str]) -> Manifest:
    """Read and validate the manifest of a checkpoint folder (or a manifest file given directly).

    Raises ``NoManifestError`` (a ``CkptpubError``) when the folder has no
    ``ckptpub.json``, and ``CkptpubError`` when it has one that cannot be used:
    not a regular file (folder, FIFO, socket, device), a symlink, over the
    manifest limit, or not a valid manifest (its identity is recomputed from its entries).
    """
    path = as_path(location, "manifest location")
    manifest_path = os.path.join(path, MANIFEST_NAME)
    try:
        fd = os.open(manifest_path, READ_FLAGS)
    except OSError as error:
        if error.errno == errno.ENOTDIR:  # a manifest file given directly
            manifest_path = path
            fd = _open_file(path)
        elif error.errno == errno.ENOENT:
            raise _absent(path) from None
        else:
            raise CkptpubError(f"{manifest_path}: {open_failure(error)}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CkptpubError(f"{manifest_path}: {kind_of(info.st_mode)}, not a regular file; a manifest must be a plain file")
        if info.st_size > MAX_MANIFEST_BYTES:
            raise CkptpubError(f"{manifest_path}: {info.st_size} bytes is over the {MAX_MANIFEST_BYTES}-byte manifest limit")
        data = _read_all(fd, info.st_size, manifest_path)
    finally:
        os.close(fd)
    return parse_manifest(data, manifest_path)


def _open_file(path: str) -> int:
    try:
        return os.open(path, READ_FLAGS)
    except OSError as error:
        raise CkptpubError(f"{path}: {open_failure(error)}") from None


def _absent(path: str) -> CkptpubError:
    """"No manifest" when the folder exists; otherwise the folder itself is the problem."""
    try:
        is_folder = stat.S_ISDIR(os.stat(path).st_mode)
    except OSError as error:
        return CkptpubError(f"{path}: {error.strerror or error}")
    if not is_folder:
        return CkptpubError(f"{path}: not a folder or manifest file")
    return NoManifestError(f"{path}: no {MANIFEST_NAME}; run 'ckptpub publish' on it first")


def _read_all(fd: int, size: int, name: str) -> bytes:
    """The file's bytes: one ``read`` when the file still has the ``size`` ``fstat`` gave; bounded if not."""
    try:
        parts = [os.read(fd, size + 1)]
        total = len(parts[0])
        while total != size and parts[-1]:  # a short read, or the file changed size: read to its end
            parts.append(os.read(fd, max(1, MAX_MANIFEST_BYTES + 1 - total)))
            total += len(parts[-1])
            if total > MAX_MANIFEST_BYTES:
                raise CkptpubError(f"{name}: grew past the {MAX_MANIFEST_BYTES}-byte manifest limit while being read")
    except OSError as error:
        raise CkptpubError(f"{name}: cannot read: {error.strerror or error}") from None
    return b"".join(parts)
