"""Models in the Hugging Face cache: which folder a hub id names, and which symlinks are a snapshot's files.

huggingface_hub keeps a downloaded model as ``<cache>/models--<org>--<name>/``:
``blobs/<etag>`` hold the files' bytes, ``refs/<branch>`` the commit a branch points
at, and ``snapshots/<commit>/<path>`` is each file of that commit as a relative
symlink to its blob. Since huggingface_hub 2.x a blob of a Xet-stored file may itself
be a symlink into the cache's shared store, ``<cache>/blobs/<2 hex>/<64 hex>``, which
a marker file ``<cache>/blobs/.huggingface-shared-blobs`` declares.

Two jobs, kept apart:

* **the link rule** (``is_cached_blob``, standard library only): a symlink of a
  snapshot folder is that model's file when it leads to a blob of the same
  repository (or to the shared store its blobs lead into). It is decided from the
  real paths alone, so folders that are not snapshots are not affected, and it costs
  a system call only for a target in the shared store (the marker's ``lstat``).
* **names** (``locate``, ``cached_model``): a hub id (``org/name``, ``ID@REVISION``)
  is resolved by huggingface_hub itself, offline (``local_files_only``: nothing is
  ever downloaded), so ``HF_HOME``, ``HF_HUB_CACHE`` and refs mean what they mean to
  transformers and vLLM. huggingface_hub is imported only when a name is not a path.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from typing import Any

from ..errors import CkptpubError

#: The parts of the cache layout (``huggingface_hub.constants`` and ``file_download.repo_folder_name``).
MODELS_PREFIX = "models--"
SNAPSHOTS = "snapshots"
BLOBS = "blobs"
#: The shared store's marker (``huggingface_hub.utils._shared_blobs.SHARED_BLOBS_MARKER_NAME``).
SHARED_STORE_MARKER = ".huggingface-shared-blobs"
_STORE_PREFIX = re.compile(r"[0-9a-f]{2}")
_STORE_NAME = re.compile(r"[0-9a-f]{64}")
#: Provenance keys: the cached model a manifest describes, and (in a fine-tune's) the base's.
HUB_KEY = "hub"
BASE_HUB_KEY = "base_hub"
#: Separates a revision from a hub id in an argument: ``acme/tiny-qwen3@v2`` (an id never holds ``@``).
REVISION_SEPARATOR = "@"


@dataclass(frozen=True)
class CachedModel:
    """A snapshot of a model in a Hugging Face cache: its folder, the repository's id and the commit."""

    folder: str
    repo_id: str
    revision: str

    def record(self) -> dict[str, str]:
        """What a manifest's provenance records about it (``hub``, or ``base_hub`` in a fine-tune's)."""
        return {"repo_id": self.repo_id, "revision": self.revision}


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


def split_revision(name: str, revision: str | None) -> tuple[str, str | None]:
    """``ID@REVISION`` as ``(ID, REVISION)``; a ``revision`` given as well must not contradict it."""
    repo_id, separator, written = name.partition(REVISION_SEPARATOR)
    if not separator:
        return name, revision
    if not written or (revision is not None and revision != written):
        raise CkptpubError(f"{name}: give the revision once, as {repo_id}@REVISION or with --revision")
    return repo_id, written


def is_hub_id(name: str) -> bool:
    """Whether ``name`` (without ``@REVISION``) is shaped like a hub id, as huggingface_hub says."""
    try:
        from huggingface_hub.errors import HFValidationError
        from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]  # documented there
    except ImportError:
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def locate(name: str, revision: str | None = None) -> str:
    """The folder ``name`` means: a path that exists, as given; otherwise a hub id's cached snapshot.

    A path that exists always wins (``revision`` is then refused: a folder has none).
    A name that is neither a path nor a hub id is returned as given, for the caller to
    report as a missing path. A hub id (``org/name`` or ``org/name@REVISION``) is
    resolved by ``huggingface_hub.snapshot_download(..., local_files_only=True)``;
    one that is not in the cache is a ``CkptpubError`` naming the cache looked in.
    """
    if os.path.lexists(name):
        if revision is not None:
            raise CkptpubError(f"{name}: a folder has no revision; --revision is for a hub id")
        return name
    repo_id, wanted = split_revision(name, revision)
    if not is_hub_id(repo_id):
        if wanted is not None:
            raise CkptpubError(f"{name}: no such folder, and {repo_id!r} is not a hub id")
        return name
    return resolve(repo_id, wanted).folder


def resolve(repo_id: str, revision: str | None = None, cache_dir: str | None = None) -> CachedModel:
    """The cached snapshot of model ``repo_id`` at ``revision`` (a branch, tag or commit; default ``main``).

    huggingface_hub answers from the cache alone (``HF_HUB_CACHE``, or ``cache_dir``),
    whatever ``HF_HUB_OFFLINE`` says, and asks for no file in particular, as vLLM's
    offline lookup does (``ignore_patterns="*"``): a snapshot some of whose files were
    never downloaded is still the folder that id means, and its manifest covers what
    is there. Raises ``CkptpubError`` (one line) when it is not there.
    """
    hub = _huggingface_hub(repo_id)
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        folder = hub.snapshot_download(
            repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True, ignore_patterns="*"
        )
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        where = cache_dir or hub.constants.HF_HUB_CACHE
        at = f" at revision {revision}" if revision is not None else ""
        raise CkptpubError(
            f"{repo_id}: no such folder, and no snapshot of the model {repo_id}{at} in the Hugging Face "
            f"cache {where} (HF_HUB_CACHE; nothing is downloaded)"
        ) from None
    return CachedModel(os.path.realpath(folder), repo_id, os.path.basename(os.path.realpath(folder)))


def cached_model(folder: str) -> CachedModel | None:
    """The real folder ``folder`` as a cached model's snapshot, if huggingface_hub resolves it to this folder.

    The id and commit are read from the layout (``models--org--name`` is
    huggingface_hub's ``repo_folder_name`` of ``org/name``) and then confirmed by
    resolving them in that same cache; None for any other folder, or without huggingface_hub.
    """
    repository = repository_of(folder)
    if repository is None:
        return None
    repo_id = os.path.basename(repository)[len(MODELS_PREFIX) :].replace("--", "/")
    try:
        found = resolve(repo_id, os.path.basename(folder), cache_dir=os.path.dirname(repository))
    except CkptpubError:
        return None
    return found if found.folder == folder else None


def _huggingface_hub(repo_id: str) -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise CkptpubError(
            f"{repo_id}: no such folder; a hub id is looked up with huggingface_hub (not installed)"
        ) from None
    return huggingface_hub
