"""Reading a manifest: one small, bounded, plain file and nothing else of the checkpoint.

A folder's manifest is read as every small file is (``safe_open.read_bounded``): one
``open`` (``O_NOFOLLOW|O_NONBLOCK``), one ``fstat`` and one ``read``. Callers on an
engine's start path (the vLLM plugin's cache key) depend on that being O(1)
filesystem requests, and a FIFO, folder or symlink named ``ckptpub.json`` is refused
without ever blocking or being followed.
"""

from __future__ import annotations

import errno
import os
import stat

from .._format.manifest import MAX_MANIFEST_BYTES, Manifest, parse_manifest
from .._format.names import MANIFEST_NAME
from ..errors import CkptpubError, NoManifestError
from .objects import ObjectUrl, is_object_url
from .safe_open import OpenError, read_bounded
from .scan import as_path
from .sources import read_small_file


def read_manifest(location: str | os.PathLike[str], *, check_tables: bool = True) -> Manifest:
    """Read and validate the manifest of a checkpoint folder (or a manifest file given directly).

    Every rule is checked; ``check_tables=False`` leaves the entries of the regions
    for the first use of its tensors (see ``parse_manifest``), for a reader that
    needs the identity alone (an engine's weight-cache key). A manifest of an older
    format (``ckptpub/1``, ``/2``) is refused in one line naming the command that
    publishes the folder again.

    Raises ``NoManifestError`` (a ``CkptpubError``) when nothing is at the folder's
    ``ckptpub.json``, and ``CkptpubError`` when something is there that cannot be
    used: not a regular file (folder, FIFO, socket, device), a symlink, over the
    manifest limit, or not a valid manifest (its identity is recomputed from its
    entries). A folder, or a path ending in ``ckptpub.json`` (always taken as the
    manifest itself, so a folder there is unusable, not absent), costs one
    ``open``, one ``fstat`` and one ``read``.
    """
    path = as_path(location, "manifest location")
    if is_object_url(path):
        return _read_object_manifest(ObjectUrl.parse(path), check_tables)
    direct = os.path.basename(path) == MANIFEST_NAME
    manifest_path = path if direct else os.path.join(path, MANIFEST_NAME)
    try:
        data = _read(manifest_path)
    except OpenError as error:
        if error.errno == errno.ENOTDIR and not direct:  # a manifest file under another name
            manifest_path = path
            try:
                data = _read(path)
            except OpenError as again:
                if again.absent:
                    raise _absent(os.path.dirname(path), path) from None
                raise
        elif error.absent:
            raise _absent(path, manifest_path) from None
        else:
            raise
    return parse_manifest(data, manifest_path, check_tables=check_tables)


def _read_object_manifest(url: ObjectUrl, check_tables: bool) -> Manifest:
    """The manifest at ``s3://bucket/prefix/ckptpub.json`` (or that object named directly): one GET."""
    manifest_url = url if url.name == MANIFEST_NAME else url.child(MANIFEST_NAME)
    try:
        data = read_small_file(
            str(manifest_url), MAX_MANIFEST_BYTES, str(manifest_url), limit_name="manifest limit"
        )
    except OpenError as error:
        if error.absent:
            raise NoManifestError(f"{url}: no {MANIFEST_NAME}; run 'ckptpub publish' on it first") from None
        raise
    return parse_manifest(data, str(manifest_url), check_tables=check_tables)


def _read(path: str) -> bytes:
    return read_bounded(path, MAX_MANIFEST_BYTES, path, limit_name="manifest limit")


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
