"""Reading a manifest: one small, bounded, non-symlink file and nothing else of the checkpoint."""

from __future__ import annotations

import errno
import os
import stat

from .errors import CkptpubError
from .manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest, parse_manifest


def read_manifest(location: str | os.PathLike[str]) -> Manifest:
    """Read and validate the manifest of a checkpoint folder (or a manifest file given directly).

    Opens only ``ckptpub.json``, refuses it if it is a symlink or larger than the
    manifest limit, and recomputes its identity from its entries.
    """
    path = os.fspath(location)
    try:
        is_folder = stat.S_ISDIR(os.stat(path).st_mode)
    except OSError as error:
        raise CkptpubError(f"{path}: {error.strerror or error}") from None
    manifest_path = os.path.join(path, MANIFEST_NAME) if is_folder else path
    try:
        fd = os.open(manifest_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ENOENT:
            raise CkptpubError(f"{path}: no {MANIFEST_NAME}; run 'ckptpub publish' on it first") from None
        if error.errno == errno.ELOOP:
            raise CkptpubError(f"{manifest_path}: is a symlink; a manifest must be a plain file") from None
        raise CkptpubError(f"{manifest_path}: cannot read: {error.strerror or error}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise CkptpubError(f"{manifest_path}: not a regular file")
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > MAX_MANIFEST_BYTES:
            raise CkptpubError(f"{manifest_path}: {info.st_size} bytes is over the {MAX_MANIFEST_BYTES}-byte manifest limit")
        try:
            data = handle.read(MAX_MANIFEST_BYTES + 1)
        except OSError as error:
            raise CkptpubError(f"{manifest_path}: cannot read: {error.strerror or error}") from None
    return parse_manifest(data, manifest_path)
