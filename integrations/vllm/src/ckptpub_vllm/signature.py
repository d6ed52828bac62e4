"""The signature check at engine start: serve only checkpoints the training job's key signed.

With ``public_key`` (or ``certificate_chain``) in ``--model-loader-extra-config``, or
``CKPTPUB_PUBLIC_KEY`` / ``CKPTPUB_CERTIFICATE_CHAIN`` in the environment of processes
that never see that config (``vllm preload`` daemons, plain ``ipc_cache`` engines),
the manifest an engine or daemon goes on with is the one whose bytes the signature
covers (``ckptpub.signing.read_trusted_manifest``, where "signed or plain" is decided):
``model.sig`` must verify with that key, carry the SHA-256 of the ``ckptpub.json``
read, and name exactly the files that manifest lists. Only ``model.sig``, the key
and ``ckptpub.json`` are read, so the daemon path still opens no shard; the
manifest's identity then keys the cache and
its tensor digests check every tensor a disk load streams, as without a key.

Fails closed: no manifest, no signature, a signature that does not verify, the
wrong key, or a key that cannot be read is a refusal, whatever ``require_manifest``
says.
"""

from __future__ import annotations

import ckptpub
from ckptpub.signing import TrustedKey, read_trusted_manifest

from .errors import RefusedError


def trusted_from_env(folder: str, kind: str = "") -> TrustedKey | None:
    """``TrustedKey.from_environment()``; both variables set is a refusal of ``folder`` (``kind``)."""
    try:
        return TrustedKey.from_environment()
    except ckptpub.CkptpubError as error:
        raise _unsigned(folder, error, kind) from None


def signed_manifest(folder: str, trusted: TrustedKey, kind: str = "") -> ckptpub.Manifest:
    """``ckptpub.signing.read_trusted_manifest`` for an engine or daemon: anything but a manifest
    ``trusted`` signed is a refusal. ``kind`` says what the folder holds in it (``adapter``; a model by
    default)."""
    try:
        return read_trusted_manifest(folder, trusted)
    except ckptpub.CkptpubError as error:
        raise _unsigned(folder, error, kind) from None


def _unsigned(folder: str, error: ckptpub.CkptpubError, kind: str) -> RefusedError:
    return RefusedError(
        folder,
        f"a signed checkpoint is required: {error}",
        hint="check it with `ckptpub verify --public-key` (or --certificate-chain)",
        kind=kind,
    )
