"""The model a training run starts from: found, identified, and recorded in every step's manifest.

A fine-tune's manifests record their base's identity (``base_identity``) and, for a
model in the Hugging Face cache, its hub id and commit (``base_hub``), so ``ckptpub
show``, ``diff`` and ``log`` can name it. The base is found where the model says it
was loaded from (``name_or_path``, its config's, a PEFT adapter's
``base_model_name_or_path`` and ``revision``) or where the user says (``base``): a
folder, or a hub id that huggingface_hub resolves in its cache, offline (a folder that
exists wins, as it does for ``from_pretrained``). Its identity is read from its
manifest. A base without one is left for the callback to publish, only when the user
consents to hashing it (``publish_base``); otherwise, and when the base cannot be
found at all, ``unidentified`` says so and how to fix it.

transformers does not record the revision a model was loaded at: a model loaded by
hub id is taken at the revision huggingface_hub resolves by default (``main``), and
one loaded at another revision must be named (``base="org/name@REVISION"``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .._filesystem.hub_cache import BASE_HUB_KEY, CachedModel, cached_model, is_hub_id, locate, split_revision
from .._filesystem.read import read_manifest
from .._format.digest import DIGEST_PREFIX
from .._format.manifest import check_identity
from .._format.names import MANIFEST_NAME
from ..errors import CkptpubError, NoManifestError


@dataclass
class Base:
    """The base of a run: how it was named, its folder and cached model (when known), its identity.

    ``identity`` is None while the base is unpublished (until the callback, with
    consent, publishes it); ``problem`` says why it could not be identified at all.
    """

    name: str
    folder: str | None = None
    cached: CachedModel | None = None
    identity: str | None = None
    problem: str | None = None

    def provenance(self) -> dict[str, Any]:
        """What each step's manifest records about it: ``base_identity`` (None if unknown), ``base_hub``."""
        record: dict[str, Any] = {"base_identity": self.identity}
        if self.identity is not None and self.cached is not None:
            record[BASE_HUB_KEY] = self.cached.record()
        return record

    @property
    def publish_command(self) -> str:
        """The command that publishes it: by hub id and commit for a cached model."""
        if self.cached is not None:
            return f"ckptpub publish {self.cached.repo_id} --revision {self.cached.revision}"
        return f"ckptpub publish {self.folder}"

    @property
    def label(self) -> str:
        """The base in messages: its folder, or its hub id, commit and folder."""
        if self.cached is not None:
            return f"{self.cached.repo_id} (revision {self.cached.revision}, {self.folder})"
        return self.folder or self.name


def find_base(model: Any, given: object = None) -> Base | None:
    """The base of a run training ``model``: ``given`` (a folder, a hub id, ``ID@REVISION`` or an
    identity) if the user named one, else where ``model`` was loaded from; None for a model built in code."""
    if given is not None:
        text = named_base(given)
        if text.startswith(DIGEST_PREFIX):
            return Base(text, identity=text)
        return _base_at(text, None)
    unresolved = None
    for name, revision in _loaded_from(model):
        base = _base_at(name, revision)
        if base is not None and base.problem is None:
            return base
        unresolved = unresolved or base
    return unresolved


def named_base(given: object) -> str:
    """The base a user named (``PublishCallback(base=...)``) as text; ``CkptpubError`` if it cannot be one."""
    text = os.fsdecode(given) if isinstance(given, str | bytes | os.PathLike) else None
    if not text:
        raise CkptpubError(f"base: expected a folder, hub id or identity, got {given!r}")
    return check_identity(text, "base") if text.startswith(DIGEST_PREFIX) else text


def _base_at(name: str, revision: str | None) -> Base | None:
    """The base ``name`` means, or None when it is neither a path nor a hub id (a name given in code)."""
    try:
        if not os.path.lexists(name) and not is_hub_id(split_revision(name, None)[0]):
            return None
        folder = locate(name, revision)
    except CkptpubError as error:
        return Base(name, problem=str(error))
    cached = cached_model(os.path.realpath(folder))
    try:
        identity = read_manifest(folder).identity
    except NoManifestError:
        return Base(name, folder, cached)
    except CkptpubError as error:
        return Base(name, folder, cached, problem=f"its {MANIFEST_NAME} is unusable: {error}")
    return Base(name, folder, cached, identity)


def _loaded_from(model: Any) -> list[tuple[str, str | None]]:
    """Where ``model`` says it was loaded from, with a revision where one is recorded (PEFT's)."""
    candidates: list[tuple[object, object]] = [
        (getattr(model, "name_or_path", None), None),
        (getattr(getattr(model, "config", None), "_name_or_path", None), None),
    ]
    peft_config = getattr(model, "peft_config", None)
    if isinstance(peft_config, dict):
        candidates += [
            (getattr(c, "base_model_name_or_path", None), getattr(c, "revision", None))
            for c in peft_config.values()
        ]
    found: list[tuple[str, str | None]] = []
    for name, revision in candidates:
        if isinstance(name, str) and name and (name, revision) not in found:
            found.append((name, revision if isinstance(revision, str) and revision else None))
    return found


def unidentified(base: Base, *, publishing: bool) -> str | None:
    """The one warning for a run whose checkpoints cannot record ``base``'s identity; None if they can."""
    if base.identity is not None or (publishing and base.problem is None):
        return None
    lost = "so this run's checkpoints will record no base_identity"
    if base.problem is not None:
        return (
            f"ckptpub: the base model {base.name} cannot be identified ({base.problem}), {lost}; "
            "publish it, or name it: PublishCallback(base=FOLDER, ID@REVISION or IDENTITY)"
        )
    return (
        f"ckptpub: the base model {base.label} has no {MANIFEST_NAME}, {lost}; publish it before training: "
        f"{base.publish_command}, or pass PublishCallback(publish_base=True) to publish it in the background"
    )
