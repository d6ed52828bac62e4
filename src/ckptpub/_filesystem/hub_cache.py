"""Models in the Hugging Face cache: which snapshot folder a hub id names, every name on the way checked.

A hub id (``org/name``, ``ID@REVISION``) is resolved offline: nothing is ever
downloaded and no network is asked, whatever ``HF_HUB_OFFLINE`` says, so a start
never waits on a hub that does not answer. The cache's layout, and which symlinks of a
snapshot are its files, are ``hub_layout``'s.

Every value read from the cache that becomes a path is checked before it is used,
since the cache is a folder anyone with write access to it can edit:

* a revision given by name (a branch or tag, ``main`` by default) is read from
  ``refs/<name>`` by ckptpub itself (a regular file, not a symlink, not a FIFO, a few
  bytes) and must hold a commit hash, 40 hex digits: a ref holding a path into another
  repository's snapshot, or anything else, is refused, naming the ref file, never
  followed. The name itself is a ref name (no ``..``, ``.`` or empty part);
* the commit is then resolved by huggingface_hub itself (``snapshot_download(...,
  local_files_only=True)``), so ``HF_HOME``, ``HF_HUB_CACHE`` and its own checks mean
  what they mean to transformers and vLLM, and its answer must really be
  ``models--<org>--<name>/snapshots/<commit>`` of the id asked for: a snapshot that is a
  symlink to another repository's, or to another commit, is refused;
* a folder taken as a cached model (``cached_model``) must be named by a commit hash.

huggingface_hub is imported only when a name is not a path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..errors import CkptpubError
from .hub_layout import COMMIT, MODELS_PREFIX, REFS, repository_of
from .safe_open import OpenError, read_bounded

#: Provenance keys: the cached model a manifest describes, and (in a fine-tune's) the base's.
HUB_KEY = "hub"
BASE_HUB_KEY = "base_hub"
#: Separates a revision from a hub id in an argument: ``acme/tiny-qwen3@v2`` (an id never holds ``@``).
REVISION_SEPARATOR = "@"
#: The revision a hub id without one means (``huggingface_hub.constants.DEFAULT_REVISION``).
DEFAULT_REVISION = "main"
#: A ref holds one commit hash (40 bytes); a file over 1 KiB is refused unread (anything shorter is read and
#: shown in the refusal).
REF_LIMIT = 1024


class NotCachedError(CkptpubError):
    """A hub id with no snapshot in the cache. ``reason`` says where it was looked for, ``fetch`` is the
    command that downloads it (ckptpub never does)."""

    def __init__(self, repo_id: str, revision: str | None, cache: str) -> None:
        at = f" at revision {revision}" if revision is not None else ""
        self.reason = (
            f"no snapshot of the model {repo_id}{at} in the Hugging Face cache {cache} "
            f"(HF_HUB_CACHE; nothing is downloaded)"
        )
        self.fetch = f"hf download {repo_id}" + (f" --revision {revision}" if revision is not None else "")
        super().__init__(f"{repo_id}: no such folder, and {self.reason}; `{self.fetch}` downloads it")


@dataclass(frozen=True)
class CachedModel:
    """A snapshot of a model in a Hugging Face cache: its folder, the repository's id and the commit."""

    folder: str
    repo_id: str
    revision: str

    def record(self) -> dict[str, str]:
        """What a manifest's provenance records about it (``hub``, or ``base_hub`` in a fine-tune's)."""
        return {"repo_id": self.repo_id, "revision": self.revision}


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
    one that is not in the cache is a ``NotCachedError`` naming the cache looked in.
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

    Answered from the cache alone (``HF_HUB_CACHE``, or ``cache_dir``), whatever
    ``HF_HUB_OFFLINE`` says, asking for no file in particular, as vLLM's offline lookup
    does (``ignore_patterns="*"``): a snapshot some of whose files were never downloaded
    is still the folder that id means, and its manifest covers what is there. A ref is
    read and checked here (``commit_of``) and huggingface_hub is handed the commit, so
    the ref is read once. Raises ``NotCachedError`` when it is not there, and
    ``CkptpubError`` (one line, naming the file) for a ref or snapshot that is not what
    huggingface_hub writes.
    """
    hub = _huggingface_hub(repo_id)
    from huggingface_hub import constants
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cache = cache_dir or constants.HF_HUB_CACHE
    name = MODELS_PREFIX + repo_id.replace("/", "--")  # huggingface_hub's ``repo_folder_name``
    commit = commit_of(os.path.join(cache, name), repo_id, revision, cache)
    try:
        folder = hub.snapshot_download(
            repo_id, revision=commit, cache_dir=cache_dir, local_files_only=True, ignore_patterns="*"
        )
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        raise NotCachedError(repo_id, revision, cache) from None
    real = os.path.realpath(folder)
    repository = repository_of(real)
    if os.path.basename(real) != commit or repository is None or os.path.basename(repository) != name:
        raise CkptpubError(
            f"{repo_id}: its snapshot {folder} leads to {real}, "
            f"not to {name}/snapshots/{commit}; not followed"
        )
    return CachedModel(real, repo_id, commit)


def commit_of(repository: str, repo_id: str, revision: str | None, cache: str) -> str:
    """The commit ``revision`` names in the cached ``repository``: a commit hash as given, a branch or tag
    read from ``refs/<revision>`` (a regular file holding a commit hash; anything else is refused)."""
    wanted = DEFAULT_REVISION if revision is None else revision
    if COMMIT.fullmatch(wanted):
        return wanted
    parts = wanted.split("/")
    if any(part in ("", ".", "..") for part in parts) or any(c in wanted for c in "\\\0\n\r"):
        raise CkptpubError(f"{repo_id}: revision {wanted!r} is not a branch, tag or commit name")
    path = os.path.join(repository, REFS, *parts)
    try:
        data = read_bounded(path, REF_LIMIT, path, limit_name="limit for a ref (one commit hash)")
    except OpenError as error:
        if error.absent:
            raise NotCachedError(repo_id, revision, cache) from None
        raise
    text = data.decode("utf-8", "replace")
    if COMMIT.fullmatch(text) is None:
        raise CkptpubError(f"{path}: holds {text!r}, not a commit hash (40 hex digits); not followed")
    return text


def cached_model(folder: str) -> CachedModel | None:
    """The real folder ``folder`` as a cached model's snapshot, if huggingface_hub resolves it to this folder.

    The id and commit are read from the layout (``models--org--name`` is
    huggingface_hub's ``repo_folder_name`` of ``org/name``) and then confirmed by
    resolving them in that same cache; None for any other folder, or without huggingface_hub.
    """
    repository = repository_of(folder)
    if repository is None or COMMIT.fullmatch(os.path.basename(folder)) is None:
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
