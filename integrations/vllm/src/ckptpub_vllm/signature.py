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
from ckptpub.integration import CERTIFICATE_CHAIN_ENV, PUBLIC_KEY_ENV

from .errors import RefusedError


def trusted_from_env() -> tuple[str | None, tuple[str, ...]]:
    """``(public_key, certificate_chain)`` from the environment (both empty when neither is set)."""
    public_key = os.environ.get(PUBLIC_KEY_ENV, "").strip() or None
    chain = tuple(p for p in os.environ.get(CERTIFICATE_CHAIN_ENV, "").split(os.pathsep) if p.strip())
    return public_key, chain


def check_signed(folder: str, public_key: str | None, certificate_chain: tuple[str, ...]) -> ckptpub.Manifest:
    """The folder's manifest once its signature holds for the trusted key or chain.

    Raises ``CkptpubError`` (one line naming the first problem) otherwise.
    """
    from ckptpub import signing

    check = signing.check_signature(folder, signing.TrustedKey(public_key, certificate_chain))
    if check.manifest is None:
        first = check.problems[0]
        more = f" (and {len(check.problems) - 1} more)" if len(check.problems) > 1 else ""
        raise ckptpub.CkptpubError(
            f"{folder}: not what the trusted key signed: {first.path}: {first.detail}{more}"
        )
    return check.manifest


def read_trusted_manifest(folder: str) -> ckptpub.Manifest:
    """``ckptpub.read_manifest``, but only the signed manifest when the environment names a trusted key."""
    public_key, chain = trusted_from_env()
    if public_key is None and not chain:
        return ckptpub.read_manifest(folder)
    return check_signed(folder, public_key, chain)


def signed_manifest(
    folder: str, public_key: str | None, certificate_chain: tuple[str, ...], kind: str = ""
) -> ckptpub.Manifest:
    """``check_signed`` for an engine or daemon: anything but a signed manifest is a refusal.

    ``kind`` says what the folder holds in the refusal (``adapter``; a model by default).
    """
    try:
        return check_signed(folder, public_key, certificate_chain)
    except ckptpub.CkptpubError as error:
        raise RefusedError(
            folder,
            f"a signed checkpoint is required: {error}",
            hint="check it with `ckptpub verify --public-key` (or --certificate-chain)",
            kind=kind,
        ) from None
