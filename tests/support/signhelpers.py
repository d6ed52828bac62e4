"""Keys, certificates and signed checkpoints for the signing tests, and the real CLIs that check them.

Keys and certificates are made with ``cryptography`` (model_signing's own dependency) and
written as PEM files, the form ``model_signing`` and ``ckptpub`` take them in.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import ckptpub
from support.checkpoints import write_checkpoint


@dataclass(frozen=True)
class KeyPair:
    private: Path
    public: Path


@dataclass(frozen=True)
class CertificateSet:
    """A signing key with its certificate, issued by ``root`` (the chain a verifier trusts)."""

    private: Path
    certificate: Path
    root: Path


def make_key(folder: Path, name: str, curve: ec.EllipticCurve | None = None) -> KeyPair:
    key = ec.generate_private_key(curve or ec.SECP256R1())
    folder.mkdir(parents=True, exist_ok=True)
    private, public = folder / f"{name}.pem", folder / f"{name}.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return KeyPair(private, public)


def make_certificates(folder: Path, name: str) -> CertificateSet:
    """A self-signed root CA and a signing certificate (digital signature usage) it issued."""
    folder.mkdir(parents=True, exist_ok=True)
    root_key, signer_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    root_name = _name(f"{name} root")
    root = _certificate(root_name, root_name, root_key.public_key(), root_key, authority=True)
    signer = _certificate(_name(f"{name} training job"), root_name, signer_key.public_key(), root_key)
    files = CertificateSet(
        folder / f"{name}-key.pem", folder / f"{name}-cert.pem", folder / f"{name}-root.pem"
    )
    files.private.write_bytes(
        signer_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    files.certificate.write_bytes(signer.public_bytes(serialization.Encoding.PEM))
    files.root.write_bytes(root.public_bytes(serialization.Encoding.PEM))
    return files


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer_key: ec.EllipticCurvePrivateKey,
    authority: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=authority, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=authority), critical=True)
        .sign(issuer_key, hashes.SHA256())
    )


def _usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def run_python(program: str, *args: object) -> subprocess.CompletedProcess[str]:
    """``python -c PROGRAM ARGS...`` in a fresh interpreter of this environment."""
    return subprocess.run(
        [sys.executable, "-c", program, *map(str, args)], capture_output=True, text=True, timeout=120
    )


def model_signing_cli(*args: object, hash_seed: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real ``model_signing`` command line (``python -m model_signing``), as a subprocess."""
    env = dict(os.environ)
    if hash_seed is not None:
        env["PYTHONHASHSEED"] = hash_seed
    return subprocess.run(
        [sys.executable, "-m", "model_signing", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def model_signing_verify(folder: Path, public_key: Path) -> subprocess.CompletedProcess[str]:
    """``model_signing verify key DIR --signature DIR/model.sig --public_key PUB``."""
    return model_signing_cli(
        "verify", "key", folder, "--signature", folder / "model.sig", "--public_key", public_key
    )


def model_signing_api_verify(folder: Path, public_key: Path) -> str | None:
    """model_signing's Python API as shipped, no hashing config set (it reads the algorithm from the
    signature): None when it accepts the folder, otherwise its error."""
    from model_signing import verifying

    try:
        verifying.Config().use_elliptic_key_verifier(public_key=public_key).verify(
            folder, folder / "model.sig"
        )
    except ValueError as error:  # what it raises for a mismatch and for a signature that does not verify
        return str(error)
    return None


def write_signable_checkpoint(folder: Path) -> Path:
    """Two shards with an index, a tokenizer, training state, a subfolder and a git path."""
    write_checkpoint(folder, shards=2)
    (folder / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    return folder


def publish_signed(folder: Path, private_key: Path, sign_hash: str = "sha256") -> ckptpub.Manifest:
    """Publish ``folder`` and sign it with ``private_key`` (the Python API)."""
    return ckptpub.publish(folder, sign=private_key, sign_hash=sign_hash)
