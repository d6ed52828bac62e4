"""The one module that imports ``model_signing``: statements, bundles and their signatures.

ckptpub computes each file's SHA-256 (or BLAKE3) in the pass that computes its tensors'
BLAKE3 digests, so the signature must be built from digests computed elsewhere. ``model_signing`` (1.1.1,
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._filesystem.safe_open import OpenError, read_bounded
from ..errors import CkptpubError

try:
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from model_signing import manifest as ms_manifest
    from model_signing._hashing import hashing as ms_hashing
    from model_signing._signing import sign_certificate, sign_ec_key, sign_sigstore_pb
    from model_signing._signing import signing as ms_signing
except ImportError as error:  # the extra is not installed (or model_signing's undeclared pyOpenSSL)
    raise CkptpubError(
        f"signing needs the model_signing package ({error.msg}): pip install 'ckptpub[sign]'"
    ) from None

#: A key or certificate file (PEM) larger than this is refused unread; a chain of a few hundred
#: certificates fits.
MAX_PEM_BYTES = 1 << 20
#: The curves model_signing signs and verifies with (``sign_ec_key._check_supported_ec_key``).
_CURVES = ("secp256r1", "secp384r1", "secp521r1")


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
    key = _PemFile(private_key, "private key")
    _ecdsa_key(key, lambda data: serialization.load_pem_private_key(data, None), "cannot sign with this key")
    try:
        if signing_certificate is None:
            return sign_ec_key.Signer(key)  # it asks its "path" for read_bytes() only
        return sign_certificate.Signer(
            key,
            _PemFile(signing_certificate, "signing certificate"),
            [_PemFile(path, "certificate chain") for path in certificate_chain],
        )
    except (ValueError, TypeError) as error:  # a certificate not of this key, not PEM certificates
        raise CkptpubError(f"{private_key}: cannot sign with this key: {_one_line(error)}") from None


def sign_statement(
    model_name: str,
    resources: Sequence[tuple[str, str]],
    hash_name: str,
    ignore_paths: Iterable[str],
    allow_symlinks: bool,
    signer: sign_ec_key.Signer,
) -> bytes:
    """The Sigstore bundle (JSON) over a ``files`` statement of ``resources`` (path, hex digest), each
    digest a ``hash_name`` one (``sha256`` or ``blake3``, model_signing's names).

    What ``model_signing sign key|certificate`` writes for the same files, digests and options
    (its ``hashing.Config().use_file_serialization(hashing_algorithm=hash_name)``):
    the statement is built by the same classes, so it holds the same data (``model_signing``
    itself does not write it byte-for-byte the same twice: protobuf orders the keys of its JSON
    objects at random, and the ignored paths come from a frozenset).
    """
    ignored = [pathlib.Path(path) for path in ignore_paths]
    serialization = ms_manifest._FileSerialization(hash_name, allow_symlinks, ignored)
    items = [
        ms_manifest.FileManifestItem(
            path=pathlib.PurePosixPath(path), digest=ms_hashing.Digest(hash_name, bytes.fromhex(digest))
        )
        for path, digest in resources
    ]
    payload = ms_signing.Payload(ms_manifest.Manifest(model_name, items, serialization))
    bundle: str = signer.sign(payload).bundle.to_json()
    return bundle.encode("utf-8")


def verify_bundle(data: bytes, verifier: ms_signing.Verifier, display_name: str) -> SignedStatement | str:
    """The statement the bundle ``data`` signs, if its signature verifies; otherwise why not, in words.

    ``verifier`` (``load_verifier``) says whom the signature must come from. Raises
    ``CkptpubError`` for bytes that are not a bundle at all.
    """
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


def load_verifier(public_key: str | None, certificate_chain: Sequence[str]) -> ms_signing.Verifier:
    """model_signing's verifier for an ECDSA public key (PEM), or for a certificate chain (PEM files).

    The files are read now; one that cannot be used (not a file, not PEM, a key type
    model_signing does not take) raises ``CkptpubError`` naming it.
    """
    if public_key is not None:
        key = _PemFile(public_key, "public key")
        _ecdsa_key(key, serialization.load_pem_public_key, "not a usable PEM public key")
        return sign_ec_key.Verifier(key)  # it asks its "path" for read_bytes() only
    chain = [_PemFile(path, "certificate chain") for path in certificate_chain]
    try:
        return sign_certificate.Verifier(chain)
    except (ValueError, TypeError) as error:
        raise CkptpubError(
            f"{', '.join(certificate_chain)}: not usable PEM certificates: {_one_line(error)}"
        ) from None


class _PemFile:
    """A key or certificate file, read once through ckptpub's bounded, non-blocking reader.

    model_signing reads the paths it is given with ``read_bytes()``, which blocks on a
    FIFO and reads ``/dev/zero`` until memory runs out; it is handed this instead (it
    asks for nothing but ``read_bytes()``). A FIFO, device or folder is refused without
    blocking, a file over ``MAX_PEM_BYTES`` unread; a symlink is followed, as the
    operator named the file (a mounted secret is often a link). A key that cannot be
    opened is a plain ``CkptpubError``, never an ``OpenError``: a reader that takes an
    absent ``OpenError`` for "nothing there" (no signature, no manifest) must not take
    a missing key for that, and go on without checking a signature.
    """

    def __init__(self, path: str, role: str) -> None:
        self.path = path
        try:
            self.data = read_bounded(path, MAX_PEM_BYTES, f"{path} ({role})", follow_symlinks=True)
        except OpenError as error:
            raise CkptpubError(str(error)) from None

    def read_bytes(self) -> bytes:
        return self.data


def _ecdsa_key(pem: _PemFile, parse: Callable[[bytes], object], refusal: str) -> None:
    """Refuse every key model_signing cannot use: it needs a PEM ECDSA key on one of three curves.

    Checked here, as ``cryptography`` parses it for model_signing, because model_signing
    itself fails on other key types with an ``AttributeError`` (it asks an RSA key for its curve).
    """
    try:
        key = parse(pem.data)
    except (ValueError, TypeError, UnsupportedAlgorithm) as error:  # not PEM, a password, an odd algorithm
        raise CkptpubError(f"{pem.path}: {refusal}: {_one_line(error)}") from None
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        if key.curve.name in _CURVES:
            return
        kind = f"ECDSA on curve {key.curve.name}"
    else:
        kind = type(key).__name__.removesuffix("PrivateKey").removesuffix("PublicKey")
    raise CkptpubError(
        f"{pem.path}: {refusal}: the key is {kind}; model_signing takes ECDSA keys on P-256, P-384 or "
        "P-521 only"
    )


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
