"""What ckptpub checks at every engine start, before any weight arrives.

The same checks run whether the weights are then mapped from a weight-cache daemon
or streamed from disk, and none of them opens, reads or ``stat``-s a weight shard.
They are the core's (``ckptpub.serving``); this module turns the engine's options into
its ``Policy``:

* the manifest: required unless the user opted out; with an identity pinned it is
  required whatever the options say, since a pin that a deleted manifest could bypass
  would pin nothing;
* with a trusted key (``public_key``/``certificate_chain``, or their environment
  variables), the signature over that manifest: the manifest then comes from the
  bytes the signature covers, and anything unsigned is refused;
* the pinned identity, if any;
* the files the engine reads itself (``ckptpub.serving.check_engine_files``).

On the daemon path that is all there is to check: the daemon holds exactly the
identity's tensors, verified when it loaded them, and the key makes it hand over
nothing else. On the disk path every tensor is verified while vLLM streams it.
"""

from __future__ import annotations

import ckptpub
from ckptpub.serving import Policy, check_engine_files, trusted_model

from .key import trusted_from_env
from .log import logger
from .options import Options


def check_before_start(folder: str, options: Options, copy: str | None = None) -> ckptpub.Manifest | None:
    """The folder's manifest once it passed every start-time check; refuses otherwise.

    ``copy``: for an object-store model (``folder`` its ``s3://`` prefix), the local folder
    vLLM pulled its small files into and reads them from (``shared.object_store``): they are
    checked there, against the manifest read from the bucket. Returns None only for a folder
    without a manifest when ``require_manifest`` is off and no identity is pinned (vLLM's own
    key and an unverified load apply).
    """
    manifest = checked_manifest(
        folder,
        options,
        expected=options.expect_identity,
        require=options.require_manifest,
        opt_out="require_manifest",
        unverified="vLLM's own key and an unverified load apply",
    )
    if manifest is None:
        return None
    if options.verify:
        check_engine_files(copy or folder, manifest, copy_of=folder if copy else None)
    logger.info("ckptpub: requested %s, identity %s", folder, manifest.identity)
    return manifest


def checked_manifest(
    folder: str,
    options: Options,
    *,
    expected: str | None,
    require: bool,
    opt_out: str,
    unverified: str,
    publish: str | None = None,
    kind: str = "",
) -> ckptpub.Manifest | None:
    """The manifest of a model's or an adapter's folder (``kind``), signed and pinned as asked.

    The key of ``options`` (else the environment's) decides "signed or plain". A folder
    without a manifest is refused when an identity is ``expected`` or when ``require``
    is set, naming ``publish`` as the command to run and ``opt_out`` as the option that
    serves it anyway; otherwise a warning says what happens instead (``unverified``) and
    None is returned.
    """
    policy = Policy(
        require_manifest=require,
        expect_identity=expected,
        trusted=options.trusted or trusted_from_env(folder, kind),
        opt_out=f"{opt_out} to false",
    )
    manifest = trusted_model(folder, policy=policy, folder=folder, kind=kind, publish=publish).manifest
    if manifest is None:
        subject = f"{kind} {folder}" if kind else folder
        logger.warning(
            "ckptpub: %s has no %s and %s is false: %s", subject, ckptpub.MANIFEST_NAME, opt_out, unverified
        )
    return manifest
