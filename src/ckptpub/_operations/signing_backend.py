"""The one module that imports ``model_signing``: statements, bundles and their signatures.

ckptpub computes each file's SHA-256 in the pass that computes its BLAKE3 digests, so
the signature must be built from digests computed elsewhere. ``model_signing`` (1.1.1,
pinned in the ``sign`` extra) builds manifests from digests only through private
modules (``manifest._FileSerialization``, ``_hashing.hashing.Digest``,
``_signing.signing.Payload``, ``_signing.sign_ec_key``, ``_signing.sign_certificate``);
they are used here and nowhere else, so an upgrade has one place to check, and
``tests/signing`` proves the result is what ``model_signing sign`` writes and what
``model_signing verify`` accepts.

Imported lazily by ``ckptpub.signing``: ``import ckptpub`` never imports
``model_signing`` (half a second, 35 packages), and a missing extra is one line.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import CkptpubError

try:
    from model_signing import manifest as ms_manifest
    from model_signing._hashing import hashing as ms_hashing
    from model_signing._signing import sign_certificate, sign_ec_key, sign_sigstore_pb
    from model_signing._signing import signing as ms_signing
except ImportError as error:  # the extra is not installed (or model_signing's undeclared pyOpenSSL)
    raise CkptpubError(
        f"signing needs the model_signing package ({error.msg}): pip install 'ckptpub[sign]'"
    ) from None

#: The only digest ``model_signing verify`` (its command line) accepts.
HASH = "sha256"


@dataclass(frozen=True)
class SignedStatement:
    """What a verified signature says: how the folder was serialized, and each resource's digest."""

    serialization: dict[str, Any]
    #: ``{path: (algorithm, hex digest)}``
    resources: dict[str, tuple[str, str]]


def load_signer(
    private_key: str, signing_certificate: str | None, certificate_chain: Sequence[str]
) -> sign_ec_key.Signer:
    """model_signing's signer for an ECDSA key, or for a certificate and its chain: the key is read now."""
    try:
        if signing_certificate is None:
            return sign_ec_key.Signer(pathlib.Path(private_key))
        return sign_certificate.Signer(
            pathlib.Path(private_key),
            pathlib.Path(signing_certificate),
            [pathlib.Path(path) for path in certificate_chain],
        )
    except OSError as error:
        raise CkptpubError(f"{error.filename}: cannot read: {error.strerror or error}") from None
    except (ValueError, TypeError) as error:  # not a PEM key, a password-protected key, an unsupported curve
        raise CkptpubError(f"{private_key}: cannot sign with this key: {_one_line(error)}") from None


def sign_statement(
    model_name: str,
    resources: Sequence[tuple[str, str]],
    ignore_paths: Iterable[str],
    allow_symlinks: bool,
    signer: sign_ec_key.Signer,
) -> bytes:
    """The Sigstore bundle (JSON) over a ``files``/SHA-256 statement of ``resources`` (path, hex digest).

    What ``model_signing sign key|certificate`` writes for the same files, digests and options:
    the statement is built by the same classes, so it holds the same data (``model_signing``
    itself does not write it byte-for-byte the same twice: protobuf orders the keys of its JSON
    objects at random, and the ignored paths come from a frozenset).
    """
    ignored = [pathlib.Path(path) for path in ignore_paths]
    serialization = ms_manifest._FileSerialization(HASH, allow_symlinks, ignored)
    items = [
        ms_manifest.FileManifestItem(
            path=pathlib.PurePosixPath(path), digest=ms_hashing.Digest(HASH, bytes.fromhex(digest))
        )
        for path, digest in resources
    ]
    payload = ms_signing.Payload(ms_manifest.Manifest(model_name, items, serialization))
    bundle: str = signer.sign(payload).bundle.to_json()
    return bundle.encode("utf-8")


def verify_bundle(
    data: bytes, public_key: str | None, certificate_chain: Sequence[str], display_name: str
) -> SignedStatement | str:
    """The statement the bundle ``data`` signs, if its signature verifies; otherwise why not, in words.

    With ``public_key`` the bundle must be signed by that ECDSA key; otherwise by a
    certificate that ``certificate_chain`` (PEM files) vouches for. Raises
    ``CkptpubError`` for a key or chain that cannot be used, or bytes that are not a
    bundle at all.
    """
    verifier = _verifier(public_key, certificate_chain)
    try:
        signature = sign_sigstore_pb.Signature(
            sign_sigstore_pb.bundle_pb.Bundle.from_dict(_bundle_dict(data))
        )
    except (ValueError, TypeError, KeyError, RecursionError) as error:  # pydantic's errors are ValueErrors
        raise CkptpubError(f"{display_name}: not a Sigstore bundle: {_one_line(error)}") from None
    try:
        signed = verifier.verify(signature)
    except Exception as error:  # noqa: BLE001 - any failure to verify untrusted bytes is a refusal
        return f"signature does not verify: {_one_line(error) or type(error).__name__}"
    resources = {
        item.identifier: (item.digest.algorithm, item.digest.digest_hex)
        for item in signed.resource_descriptors()
    }
    return SignedStatement(dict(signed.serialization_type), resources)


def _verifier(public_key: str | None, certificate_chain: Sequence[str]) -> ms_signing.Verifier:
    try:
        if public_key is not None:
            return sign_ec_key.Verifier(pathlib.Path(public_key))
        return sign_certificate.Verifier([pathlib.Path(path) for path in certificate_chain])
    except OSError as error:
        raise CkptpubError(f"{error.filename}: cannot read: {error.strerror or error}") from None
    except (ValueError, TypeError) as error:
        what = public_key if public_key is not None else ", ".join(certificate_chain)
        raise CkptpubError(
            f"{what}: not a usable PEM public key or certificate: {_one_line(error)}"
        ) from None


def _bundle_dict(data: bytes) -> dict[str, Any]:
    """The bundle as ``sign_sigstore_pb.Signature.read`` parses a file, but from bytes already read."""
    parsed = json.loads(data.decode("utf-8"))
    if not isinstance(parsed, dict) or not isinstance(parsed.get("verificationMaterial"), dict):
        raise ValueError("no verificationMaterial object")
    material = parsed["verificationMaterial"]
    material.setdefault("tlogEntries", [])
    if isinstance(material.get("publicKey"), dict):
        material["publicKey"].setdefault("hint", None)
        for key in ("rawBytes", "keyDetails"):
            material["publicKey"].pop(key, None)
    return parsed


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())
