"""The Hugging Face cache's layout, and which symlinks of a snapshot are that model's files.

huggingface_hub keeps a downloaded model as ``<cache>/models--<org>--<name>/``:
``blobs/<etag>`` hold the files' bytes, ``refs/<branch>`` the commit a branch points
at, and ``snapshots/<commit>/<path>`` is each file of that commit as a relative
symlink to its blob. Since huggingface_hub 2.x a blob of a Xet-stored file may itself
be a symlink into the cache's shared store, ``<cache>/blobs/<2 hex>/<64 hex>``, which
a marker file ``<cache>/blobs/.huggingface-shared-blobs`` declares.

**The link rule** (``is_cached_blob``, standard library only, so that ``safe_open``
can apply it below everything that reads a cache): a symlink of a snapshot folder is
that model's file when it leads to a blob of the same repository (or to the shared
store its blobs lead into). It is decided from the real paths alone, so folders that
are not snapshots are not affected, and it costs a system call only for a target in
the shared store (the marker's ``lstat``). Which folder a hub id names is
``hub_cache``'s job.
"""

from __future__ import annotations

import os
import re
import stat

#: The parts of the cache layout (``huggingface_hub.constants`` and ``file_download.repo_folder_name``).
MODELS_PREFIX = "models--"
SNAPSHOTS = "snapshots"
BLOBS = "blobs"
REFS = "refs"
#: The shared store's marker (``huggingface_hub.utils._shared_blobs.SHARED_STORE_MARKER_NAME``).
SHARED_STORE_MARKER = ".huggingface-shared-blobs"
#: A commit hash, as a ref holds it and a snapshot is named (``huggingface_hub.constants.REGEX_COMMIT_HASH``).
COMMIT = re.compile(r"[0-9a-f]{40}")
_STORE_PREFIX = re.compile(r"[0-9a-f]{2}")
_STORE_NAME = re.compile(r"[0-9a-f]{64}")


def repository_of(root: str) -> str | None:
    """The cached repository whose snapshot is the real folder ``root``; None for any other folder."""
    snapshots = os.path.dirname(root)
    repository = os.path.dirname(snapshots)
    name = os.path.basename(repository)
    if os.path.basename(snapshots) == SNAPSHOTS and name.startswith(MODELS_PREFIX) and name != MODELS_PREFIX:
        return repository
    return None


def is_cached_blob(root: str, target: str) -> bool:
    """Whether the real path ``target`` is a blob of the cached model whose snapshot is the folder ``root``.

    That is a file directly in the repository's ``blobs/``, or in the cache's shared
    store (``blobs/<2 hex>/<64 hex>`` beside the repositories, marked as huggingface_hub
    marks it), where a blob of a Xet-stored file leads. Anything else is not.
    """
    repository = repository_of(root)
    if repository is None:
        return False
    folder = os.path.dirname(target)
    if folder == os.path.join(repository, BLOBS):
        return True
    store = os.path.join(os.path.dirname(repository), BLOBS)
    return (
        os.path.dirname(folder) == store
        and _STORE_PREFIX.fullmatch(os.path.basename(folder)) is not None
        and _STORE_NAME.fullmatch(os.path.basename(target)) is not None
        and _is_regular_file(os.path.join(store, SHARED_STORE_MARKER))
    )


def _is_regular_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
