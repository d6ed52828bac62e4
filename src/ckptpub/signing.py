"""Signed checkpoints: ``model.sig``, a signature in OpenSSF ``model_signing``'s format.

``publish(folder, sign=SigningKey(...))`` (or a private key's path) writes it, listing
each file's SHA-256 (what the ``model_signing verify`` command checks) or, with
``sign_hash="blake3"``, its BLAKE3 (``SIGN_HASHES``);
``check_signature`` checks it reading only ``model.sig`` and ``ckptpub.json``;
``verify_signed`` checks it and then every byte. ``read_trusted_manifest(folder,
trusted)`` is where "signed or plain" is decided: with a ``TrustedKey`` (from options
with ``TrustedKey.of``, or ``TrustedKey.from_environment``) only the manifest it signed,
with None the folder's own. ``model_signing`` is the optional
``sign`` extra, imported only when a signature is made or checked. The chain of
trust is in ``docs/security.md``; the implementation is ``ckptpub._operations.signing``.
"""

from ._operations.signing import (
    SIGN_HASHES,
    SignatureCheck,
    Signer,
    SigningKey,
    TrustedKey,
    check_signature,
    read_trusted_manifest,
    verify_signed,
)

__all__ = [
    "SIGN_HASHES",
    "SignatureCheck",
    "Signer",
    "SigningKey",
    "TrustedKey",
    "check_signature",
    "read_trusted_manifest",
    "verify_signed",
]
