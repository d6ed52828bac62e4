"""Which manifest an engine trusts for a model reference: resolved once, then used for the key and the load.

An engine names a model by a folder or a hub id; everything it then checks (the cache
key, the files it reads, every tensor it streams) must be checked against one manifest,
read once, from one folder. ``trusted_model`` is that one decision:

* the reference becomes a folder (``model_folder``: a path as given, an ``s3://`` prefix as
  given, or a hub id's snapshot in the Hugging Face cache, resolved offline; a hub id not in
  the cache is refused, since nothing there could be checked);
* the folder's manifest is read in a handful of filesystem requests (one GET for a
  prefix: the bucket's own ``ckptpub.json``, never a copy an engine pulled), no shard opened:
  with a trusted key (``Policy.trusted``) only the manifest that key signed, anything
  unsigned refused; without one, the folder's own. Anything at the manifest's path
  that is not a valid manifest is refused, never taken as "no manifest";
* a folder without a manifest is refused when a manifest is required or an identity
  is pinned (a pin a deleted manifest could bypass would pin nothing); otherwise the
  caller is told there is none (``TrustedModel.manifest`` None) and keeps its engine's
  own key and an unverified load, saying so;
* a pinned identity (``Policy.expect_identity``) must be the manifest's.

The cache key is then the manifest's identity (``TrustedModel.cache_key``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .._filesystem.hub_cache import NotCachedError, cached_model, locate, split_revision
from .._filesystem.objects import ObjectAbsentError, ObjectUrl, is_object_url, stat_object
from .._filesystem.read import read_manifest
from .._format.manifest import Manifest
from .._format.names import MANIFEST_NAME
from .._operations.signing import TrustedKey, read_trusted_manifest
from .._settings import REQUIRE_MANIFEST_ENV, env_flag
from ..errors import CkptpubError, NoManifestError
from .refusal import RefusedError


@dataclass(frozen=True)
class Policy:
    """What a model must show before an engine serves it.

    ``require_manifest``: refuse a folder without ``ckptpub.json``. ``expect_identity``:
    refuse unless the manifest's identity is this one (and refuse a folder without a
    manifest whatever ``require_manifest`` says). ``trusted``: refuse unless ``model.sig``
    signs exactly the manifest with this key. ``opt_out`` names, in a refusal, the setting
    that serves a folder without a manifest anyway (an engine option's name).
    """

    require_manifest: bool = True
    expect_identity: str | None = None
    trusted: TrustedKey | None = None
    opt_out: str = REQUIRE_MANIFEST_ENV + "=0"

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Policy:
        """The policy of a process that sees no engine option (a cache daemon, a plain engine).

        ``CKPTPUB_REQUIRE_MANIFEST`` (off unless set: such a process serves what its engine
        serves) and ``CKPTPUB_PUBLIC_KEY``/``CKPTPUB_CERTIFICATE_CHAIN``. A flag that is
        neither on nor off, or both keys set, is a ``CkptpubError``: fail closed.
        """
        return cls(
            require_manifest=env_flag(REQUIRE_MANIFEST_ENV, environ=environ),
            trusted=TrustedKey.from_environment(environ),
        )


@dataclass(frozen=True)
class TrustedModel:
    """A model reference resolved once: where its files are, and the manifest every check uses.

    ``manifest`` is None only for a folder without one that the policy lets through
    unverified: the engine's own key and load apply.
    """

    reference: str
    folder: str
    manifest: Manifest | None

    @property
    def cache_key(self) -> str | None:
        """The checkpoint part of a weight-cache key: the manifest's identity (None: the engine's own key)."""
        return None if self.manifest is None else self.manifest.identity


def model_folder(reference: str, revision: str | None = None) -> str:
    """The folder an engine's model reference names: an ``s3://`` prefix as given (another store's
    scheme is refused), the path when something is there (an engine that resolved a hub id hands over its
    snapshot path), else the hub id's snapshot at ``revision`` in the Hugging Face cache, resolved
    offline (no network, whatever ``HF_HUB_OFFLINE`` says). A hub id not in the cache is a
    ``RefusedError`` naming the commands that download and publish it; a ref or snapshot of the cache
    that is not what huggingface_hub writes, one naming that file."""
    if is_object_url(reference):
        try:
            return str(ObjectUrl.parse(reference))
        except CkptpubError as error:
            raise RefusedError(reference, str(error)) from None
    if os.path.lexists(reference):
        return reference
    try:
        return locate(reference, revision)
    except NotCachedError as error:
        repo_id, wanted = split_revision(reference, revision)
        at = "" if wanted is None else f" --revision {wanted}"
        hint = f"download it with `{error.fetch}`, then publish it with `ckptpub publish {repo_id}{at}`"
        raise RefusedError(reference, error.reason, hint=hint) from None
    except CkptpubError as error:
        raise RefusedError(reference, str(error)) from None


def publish_command(folder: str) -> str:
    """The command that publishes ``folder``: by hub id and commit for a model in the Hugging Face cache."""
    cached = cached_model(os.path.realpath(folder))
    if cached is None:
        return f"ckptpub publish {folder}"
    return f"ckptpub publish {cached.repo_id} --revision {cached.revision}"


def has_manifest(folder: str) -> bool:
    """Whether anything (a valid manifest or not) is at the folder's manifest path: one ``lstat``, or one
    HEAD request for an ``s3://`` prefix (a failure other than "nothing there" is a ``RefusedError``; a
    HEAD cannot tell a missing bucket from a missing object, which ``read_folder_manifest`` refuses)."""
    if not is_object_url(folder):
        return os.path.lexists(os.path.join(folder, MANIFEST_NAME))
    try:
        stat_object(ObjectUrl.parse(folder).child(MANIFEST_NAME), f"{folder}/{MANIFEST_NAME}")
    except ObjectAbsentError:
        return False
    except CkptpubError as error:
        raise RefusedError(folder, str(error)) from None
    return True


def read_folder_manifest(
    folder: str, trusted: TrustedKey | None = None, *, kind: str = "", check_tables: bool = True
) -> Manifest | None:
    """The folder's manifest (the one ``trusted`` signed, with a key); None only when nothing is at its path.

    One open, ``fstat`` and read of ``ckptpub.json`` (and of ``model.sig`` and the key,
    with a key), or one GET of it below an ``s3://`` prefix; no shard. ``kind`` names what
    the folder holds in a refusal.
    ``check_tables=False`` leaves the entries' own checks for their first use (a reader
    that needs the identity alone, such as a cache key: it commits to those bytes).
    """
    if trusted is not None:
        try:
            return read_trusted_manifest(folder, trusted)
        except CkptpubError as error:
            raise RefusedError(
                folder,
                f"a signed checkpoint is required: {error}",
                hint="check it with `ckptpub verify --public-key` (or --certificate-chain)",
                kind=kind,
            ) from None
    path = os.path.join(folder, MANIFEST_NAME)
    try:
        return read_manifest(path, check_tables=check_tables)
    except NoManifestError:
        return None
    except CkptpubError as error:
        if not is_object_url(folder) and not os.path.lexists(path):
            return None
        raise RefusedError(folder, f"its {MANIFEST_NAME} is unusable: {error}", kind=kind) from None


def trusted_model(
    reference: str,
    revision: str | None = None,
    *,
    policy: Policy,
    folder: str | None = None,
    kind: str = "",
    check_tables: bool = True,
    publish: str | None = None,
) -> TrustedModel:
    """``reference`` resolved to its folder (``folder`` when the caller resolved it already) and the
    manifest the policy trusts; a ``RefusedError`` whenever the policy is not met.

    ``kind`` names what the folder holds in a refusal (``adapter``; a model by default),
    ``publish`` the command a refusal for a missing manifest names (``publish_command``'s
    by default), ``check_tables`` is ``read_folder_manifest``'s.
    """
    where = model_folder(reference, revision) if folder is None else folder
    manifest = read_folder_manifest(where, policy.trusted, kind=kind, check_tables=check_tables)
    expected = policy.expect_identity
    if manifest is None:
        if expected is not None:
            raise RefusedError(
                where, f"no {MANIFEST_NAME}, so the pinned identity {expected} cannot be checked", kind=kind
            )
        if policy.require_manifest:
            raise RefusedError(
                where,
                f"no {MANIFEST_NAME}",
                hint=f"publish it with `{publish or publish_command(where)}`, "
                f"or set {policy.opt_out} to serve it unverified",
                kind=kind,
            )
    elif expected is not None and manifest.identity != expected:
        raise RefusedError(
            where, f"its identity {manifest.identity} is not the expected {expected}", kind=kind
        )
    return TrustedModel(reference, where, manifest)
