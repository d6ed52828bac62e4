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

from .._format.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest, parse_manifest
from ..errors import CkptpubError, NoManifestError
from .safe_open import READ_FLAGS, kind_of, open_failure
from .scan import as_path


def read_manifest(location: str | os.PathLike[str]) -> Manifest:
    """Read and validate the manifest of a checkpoint folder (or a manifest file given directly).

    Raises ``NoManifestError`` (a ``CkptpubError``) when nothing is at the folder's
    ``ckptpub.json``, and ``CkptpubError`` when something is there that cannot be
    used: not a regular file (folder, FIFO, socket, device), a symlink, over the
    manifest limit, or not a valid manifest (its identity is recomputed from its
    entries). A folder, or a path ending in ``ckptpub.json`` (always taken as the
    manifest itself, so a folder there is unusable, not absent), costs one
    ``open``, one ``fstat`` and one ``read``.
    """
    path = as_path(location, "manifest location")
    direct = os.path.basename(path) == MANIFEST_NAME
    manifest_path = path if direct else os.path.join(path, MANIFEST_NAME)
    try:
        fd = os.open(manifest_path, READ_FLAGS)
    except OSError as error:
        if error.errno == errno.ENOTDIR and not direct:  # a manifest file under another name
            manifest_path = path
            fd = _open_file(path)
        elif error.errno == errno.ENOENT:
            raise _absent(path, manifest_path) from None
        else:
            raise CkptpubError(f"{manifest_path}: {open_failure(error)}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CkptpubError(
                f"{manifest_path}: {kind_of(info.st_mode)}, not a regular file; "
                "a manifest must be a plain file"
            )
        if info.st_size > MAX_MANIFEST_BYTES:
            raise CkptpubError(
                f"{manifest_path}: {info.st_size} bytes is over the {MAX_MANIFEST_BYTES}-byte manifest limit"
            )
        data = _read_all(fd, info.st_size, manifest_path)
    finally:
        os.close(fd)
    return parse_manifest(data, manifest_path)


def _open_file(path: str) -> int:
    try:
        return os.open(path, READ_FLAGS)
    except OSError as error:
        if error.errno == errno.ENOENT:
            raise _absent(os.path.dirname(path), path) from None
        raise CkptpubError(f"{path}: {open_failure(error)}") from None


def _absent(path: str, manifest_path: str) -> CkptpubError:
    """ "No manifest" when the folder that would hold it exists; otherwise the path itself is the problem."""
    folder = os.path.dirname(manifest_path) or "."
    try:
        is_folder = stat.S_ISDIR(os.stat(folder).st_mode)
    except OSError as error:
        return CkptpubError(f"{path}: {error.strerror or error}")
    if not is_folder:
        return CkptpubError(f"{path}: not a folder or manifest file")
    where = folder if manifest_path == path else path
    return NoManifestError(f"{where}: no {MANIFEST_NAME}; run 'ckptpub publish' on it first")


def _read_all(fd: int, size: int, name: str) -> bytes:
    """The file's bytes: one ``read`` when the file still has the ``size`` ``fstat`` gave; bounded if not."""
    try:
        parts = [os.read(fd, size + 1)]
        total = len(parts[0])
        while total != size and parts[-1]:  # a short read, or the file changed size: read to its end
            parts.append(os.read(fd, max(1, MAX_MANIFEST_BYTES + 1 - total)))
            total += len(parts[-1])
            if total > MAX_MANIFEST_BYTES:
                raise CkptpubError(
                    f"{name}: grew past the {MAX_MANIFEST_BYTES}-byte manifest limit while being read"
                )
    except OSError as error:
        raise CkptpubError(f"{name}: cannot read: {error.strerror or error}") from None
    return b"".join(parts)
