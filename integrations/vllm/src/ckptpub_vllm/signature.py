"""The signature check at engine start: serve only checkpoints the training job's key signed.

With ``public_key`` (or ``certificate_chain``) in ``--model-loader-extra-config``, or
``CKPTPUB_PUBLIC_KEY`` / ``CKPTPUB_CERTIFICATE_CHAIN`` in the environment of processes
that never see that config (``vllm preload`` daemons, plain ``ipc_cache`` engines),
the manifest an engine or daemon goes on with is the one whose bytes the signature
covers (``ckptpub.signing.check_signature``): ``model.sig`` must verify with that key,
carry the SHA-256 of the ``ckptpub.json`` read, and name exactly the files that
manifest lists. Only ``model.sig``, the key and ``ckptpub.json`` are read, so the
daemon path still opens no shard; the manifest's identity then keys the cache and
its tensor digests check every tensor a disk load streams, as without a key.

Fails closed: no manifest, no signature, a signature that does not verify, the
wrong key, or a key that cannot be read is a refusal, whatever ``require_manifest``
says.
"""

from __future__ import annotations

import os

import ckptpub

from .errors import RefusedError

PUBLIC_KEY_ENV = "CKPTPUB_PUBLIC_KEY"
#: PEM files, separated by ``os.pathsep`` (``:``).
CERTIFICATE_CHAIN_ENV = "CKPTPUB_CERTIFICATE_CHAIN"


def trusted_from_env() -> tuple[str | None, tuple[str, ...]]:
    """``(public_key, certificate_chain)`` from the environment (both empty when neither is set)."""
    public_key = os.environ.get(PUBLIC_KEY_ENV, "").strip() or None
    chain = tuple(p for p in os.environ.get(CERTIFICATE_CHAIN_ENV, "").split(os.pathsep) if p.strip())
    return public_key, chain


def signed_manifest(
    folder: str, public_key: str | None, certificate_chain: tuple[str, ...]
) -> ckptpub.Manifest:
    """The folder's manifest once its signature holds for the trusted key or chain; refuses otherwise."""
    from ckptpub import signing

    try:
        check = signing.check_signature(folder, signing.TrustedKey(public_key, certificate_chain))
    except ckptpub.CkptpubError as error:
        raise RefusedError(folder, f"a signed checkpoint is required: {error}") from None
    if check.manifest is None:
        raise RefusedError.for_problems(
            folder,
            check.problems,
            hint="it is not what the trusted key signed; verify it with `ckptpub verify --public-key`",
        )
    return check.manifest
