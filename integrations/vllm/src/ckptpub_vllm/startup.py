"""What ckptpub checks at every engine start, before any weight arrives.

The same checks run whether the weights are then mapped from a weight-cache daemon
or streamed from disk, and none of them opens, reads or ``stat``-s a weight shard:

* the manifest (``key.read_folder_manifest``): required unless the user opted out;
  with an identity pinned it is required whatever the options say, since a pin that
  a deleted manifest could bypass would pin nothing;
* with a trusted key (``public_key``/``certificate_chain``, or their environment
  variables), the signature over that manifest (``signature``): the manifest then
  comes from the bytes the signature covers, and anything unsigned is refused;
* the pinned identity, if any;
* the files the engine reads itself (``engine_files``).

On the daemon path that is all there is to check: the daemon holds exactly the
identity's tensors, verified when it loaded them, and the key makes it hand over
nothing else. On the disk path every tensor is verified while vLLM streams it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import ckptpub
from ckptpub.integration import cached_model

from .engine_files import check_engine_files
from .errors import RefusedError
from .key import read_folder_manifest
from .log import logger
from .options import Options
from .signature import signed_manifest


def check_before_start(folder: str, options: Options) -> ckptpub.Manifest | None:
    """The folder's manifest once it passed every start-time check; refuses otherwise.

    Returns None only for a folder without a manifest when ``require_manifest`` is
    off and no identity is pinned (vLLM's own key and an unverified load apply).
    """
    manifest = checked_manifest(
        folder,
        options,
        expected=options.expect_identity,
        require=options.require_manifest,
        publish=lambda: publish_command(folder),
        opt_out="require_manifest",
        unverified="vLLM's own key and an unverified load apply",
    )
    if manifest is None:
        return None
    if options.verify:
        check_engine_files(folder, manifest)
    logger.info("ckptpub: requested %s, identity %s", folder, manifest.identity)
    return manifest


def publish_command(folder: str) -> str:
    """The command that publishes ``folder``: by hub id and commit for a model in the Hugging Face cache."""
    cached = cached_model(os.path.realpath(folder))
    if cached is None:
        return f"ckptpub publish {folder}"
    return f"ckptpub publish {cached.repo_id} --revision {cached.revision}"


def checked_manifest(
    folder: str,
    options: Options,
    *,
    expected: str | None,
    require: bool,
    publish: Callable[[], str],
    opt_out: str,
    unverified: str,
    kind: str = "",
) -> ckptpub.Manifest | None:
    """The manifest of a model's or an adapter's folder (``kind``), signed and pinned as asked.

    With a trusted key in ``options`` only the manifest it signed is returned. A
    folder without a manifest is refused when an identity is ``expected`` (a pin a
    deleted manifest could bypass would pin nothing) or when ``require`` is set,
    with ``publish()`` as the command to run and ``opt_out`` as the option that serves
    it anyway; otherwise a warning says what happens instead (``unverified``) and
    None is returned.
    """
    trusted = options.trusted
    manifest = signed_manifest(folder, trusted, kind) if trusted else read_folder_manifest(folder, kind)
    if manifest is None:
        if expected is not None:
            raise RefusedError(
                folder,
                f"no {ckptpub.MANIFEST_NAME}, so the pinned identity {expected} cannot be checked",
                kind=kind,
            )
        if require:
            raise RefusedError(
                folder,
                f"no {ckptpub.MANIFEST_NAME}",
                hint=f"publish it with `{publish()}`, or set {opt_out} to false to serve it unverified",
                kind=kind,
            )
        subject = f"{kind} {folder}" if kind else folder
        logger.warning(
            "ckptpub: %s has no %s and %s is false: %s", subject, ckptpub.MANIFEST_NAME, opt_out, unverified
        )
        return None
    if expected is not None and manifest.identity != expected:
        reason = f"its identity {manifest.identity} is not the expected {expected}"
        raise RefusedError(folder, reason, kind=kind)
    return manifest
