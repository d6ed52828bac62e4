"""Signed checkpoints: ``model.sig``, a signature in OpenSSF ``model_signing``'s format.

Publishing with a key writes, next to ``ckptpub.json``, a Sigstore bundle over an
in-toto statement in ``model_signing``'s ``files`` serialization: the digest of every
file of the folder, ``ckptpub.json`` included (model_signing's git paths and the
signature itself left out, as ``model_signing sign`` leaves them out). The digest is
SHA-256 by default, the only one the ``model_signing verify`` command checks, or
BLAKE3 (``sign_hash="blake3"``), which model_signing's Python API verifies and which
costs far less to compute. Either comes from the read pass that computes the
manifest's BLAKE3 digests, so signing reads no byte twice.

Because ``ckptpub.json`` is among the signed files, a verifier that holds the key
needs to read only the signature and ``ckptpub.json``: once the signature verifies,
names exactly the manifest's files and carries the digest of the manifest bytes it
read, the manifest's BLAKE3 digests (checked by ``verify`` or by the vLLM loader as
tensors stream in) vouch for every byte, whichever hash the signature lists. That is
what ``check_signature`` does, and what an engine does at start-up without opening a
weight file. See
``docs/security.md`` for the chain of trust.

``model_signing`` is an optional extra (``pip install ckptpub[sign]``), imported only
when a signature is made or checked (see ``signing_backend``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .._filesystem.read import read_manifest
from .._filesystem.safe_open import OpenError, read_bounded
from .._filesystem.scan import as_path
from .._format.manifest import MAX_MANIFEST_BYTES, Manifest, parse_manifest
from .._format.names import MANIFEST_NAME, SIGNATURE_NAME
from .._hashing.engine import FILE_HASHES, ProgressCallback, check_file_hash, new_file_hasher
from .._hashing.options import SpanHasher
from .._settings import CERTIFICATE_CHAIN_ENV, PUBLIC_KEY_ENV
from ..errors import CkptpubError, NoManifestError, and_more
from .verify import Problem, VerifyReport, verify

#: Paths ``model_signing`` leaves out of a signature unless told otherwise (its "git paths"),
#: each a file or a folder at the top of the checkpoint. ``model_signing verify`` leaves them
#: out too, so a signature that listed them would not verify there. ``ckptpub.json`` still
#: covers them, and it is signed.
UNSIGNED_PATHS = (".git", ".gitattributes", ".github", ".gitignore")
#: A bundle lists about 150 bytes per file; the manifest's limit is far above what 200,000 files need.
MAX_SIGNATURE_BYTES = MAX_MANIFEST_BYTES
#: The file digests a signature may list (model_signing's names). SHA-256 is the default because the
#: ``model_signing verify`` command checks nothing else; see ``docs/security.md`` for when to pick BLAKE3.
SIGN_HASHES = FILE_HASHES
DEFAULT_SIGN_HASH = "sha256"


@dataclass(frozen=True)
class SigningKey:
    """Who signs: an ECDSA private key (PEM, P-256/P-384/P-521), as ``model_signing sign key`` takes it.

    With ``signing_certificate`` (the key's certificate, PEM) and ``certificate_chain``
    (the PEM certificates up to a root the verifier trusts) it signs as
    ``model_signing sign certificate`` does, and verifiers trust the chain's root
    instead of this one key.
    """

    private_key: str
    signing_certificate: str | None = None
    certificate_chain: tuple[str, ...] = ()

    @classmethod
    def of(cls, value: object) -> SigningKey:
        """``value`` as a ``SigningKey``: one already, or the path of a private key."""
        if isinstance(value, SigningKey):
            return value
        return cls(as_path(value, "sign"))

    def __post_init__(self) -> None:  # paths as str (PathLike and bytes accepted), or a CkptpubError
        _set(self, "private_key", as_path(self.private_key, "private_key"))
        if self.signing_certificate is not None:
            _set(self, "signing_certificate", as_path(self.signing_certificate, "signing_certificate"))
        _set(self, "certificate_chain", _paths(self.certificate_chain, "certificate_chain"))
        if self.certificate_chain and self.signing_certificate is None:
            raise CkptpubError("certificate_chain: given without the signing_certificate it vouches for")


@dataclass(frozen=True)
class TrustedKey:
    """Whom a verifier trusts: the signer's ECDSA public key (PEM), or a certificate chain (PEM files).

    Exactly one of the two, as ``model_signing verify key`` / ``verify certificate`` take them.
    """

    public_key: str | None = None
    certificate_chain: tuple[str, ...] = ()

    def __post_init__(self) -> None:  # paths as str (PathLike and bytes accepted), or a CkptpubError
        if self.public_key is not None:
            _set(self, "public_key", as_path(self.public_key, "public_key"))
        _set(self, "certificate_chain", _paths(self.certificate_chain, "certificate_chain"))
        if (self.public_key is None) == (not self.certificate_chain):
            raise CkptpubError("give either a public key or a certificate chain to verify a signature with")

    @classmethod
    def of(cls, public_key: str | None, certificate_chain: Sequence[str] = ()) -> TrustedKey | None:
        """The key a verifier was given, or None when it was given neither (nothing signed is required).

        The one shape of "is a signature required": ``TrustedKey | None``. Both given
        is a ``CkptpubError``, as for the constructor.
        """
        if public_key is None and not certificate_chain:
            return None
        return cls(public_key, tuple(certificate_chain))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> TrustedKey | None:
        """``CKPTPUB_PUBLIC_KEY`` or ``CKPTPUB_CERTIFICATE_CHAIN`` (PEM files, ``os.pathsep``-separated).

        What engines, daemons and ``ckptpub preload`` trust when no option says so; None when neither is set.
        """
        public_key = environ.get(PUBLIC_KEY_ENV, "").strip() or None
        chain = [path for path in environ.get(CERTIFICATE_CHAIN_ENV, "").split(os.pathsep) if path.strip()]
        return cls.of(public_key, chain)


class Signer:
    """A ``SigningKey`` loaded and checked: made before anything is hashed, so a key that cannot
    sign fails a publish before anything is written."""

    def __init__(self, key: SigningKey) -> None:
        from . import signing_backend

        self.key = key
        self._backend = signing_backend.load_signer(
            key.private_key, key.signing_certificate, key.certificate_chain
        )

    @classmethod
    def load(cls, value: object) -> Signer:
        """``value`` (a ``Signer``, a ``SigningKey`` or a private key's path) as a loaded ``Signer``."""
        return value if isinstance(value, Signer) else cls(SigningKey.of(value))

    def sign(
        self, model_name: str, resources: Sequence[tuple[str, str]], sign_hash: str, allow_symlinks: bool
    ) -> bytes:
        """The bundle over ``resources`` (``signed_resources``, ``sign_hash`` digests), leaving out what
        model_signing leaves out."""
        from . import signing_backend

        ignored = (SIGNATURE_NAME, *UNSIGNED_PATHS)
        return signing_backend.sign_statement(
            model_name, resources, sign_hash, ignored, allow_symlinks, self._backend
        )


def _paths(values: object, what: str) -> tuple[str, ...]:
    if not isinstance(values, (tuple, list)):
        raise CkptpubError(f"{what}: expected a list of paths, got {type(values).__name__}")
    return tuple(as_path(value, what) for value in values)


def _set(instance: object, name: str, value: object) -> None:
    """Normalise a field of a frozen dataclass in ``__post_init__``."""
    object.__setattr__(instance, name, value)


def is_unsigned_path(path: str) -> bool:
    """Whether a manifest path is one ``model_signing`` leaves out of a signature (a git path)."""
    return any(path == top or path.startswith(top + "/") for top in UNSIGNED_PATHS)


def signed_resources(
    manifest: Manifest, file_digests: Mapping[str, str], manifest_bytes: bytes, sign_hash: str
) -> list[tuple[str, str]]:
    """The ``(path, hex digest)`` pairs a signature lists, sorted: the manifest's files, ``ckptpub.json``.

    ``file_digests`` holds each file's ``sign_hash`` digest; the manifest's is computed here.
    """
    resources = [(MANIFEST_NAME, digest_of(manifest_bytes, sign_hash))]
    for record in manifest.files:
        if is_unsigned_path(record.path):
            continue
        digest = file_digests.get(record.path)
        if digest is None:
            raise CkptpubError(f"{record.path}: no {sign_hash} digest was computed for it; cannot sign")
        resources.append((record.path, digest))
    return sorted(resources)


def digest_of(data: bytes, algorithm: str) -> str:
    """The hex digest of ``data`` with one of ``SIGN_HASHES``, as a signature lists it."""
    hasher = new_file_hasher(algorithm)()
    hasher.update(data)
    return hasher.hexdigest()


def signature_for(
    root: str,
    manifest: Manifest,
    file_digests: Mapping[str, str],
    signer: Signer,
    *,
    sign_hash: str = DEFAULT_SIGN_HASH,
    allow_symlinks: bool = False,
) -> bytes:
    """The bytes of ``model.sig`` for the folder ``root`` published with ``manifest``.

    ``manifest``'s canonical bytes (what ``ckptpub.json`` holds) are what is signed,
    ``file_digests`` is the ``sign_hash`` digest (``SIGN_HASHES``) of each of its whole
    files, read in the same pass as their BLAKE3 tensor digests (``engine.hash_files``).
    ``allow_symlinks`` is recorded as model_signing records it: a folder with symlinks
    verifies with ``model_signing verify --allow_symlinks``.
    """
    sign_hash = check_file_hash(sign_hash, "sign_hash")
    resources = signed_resources(manifest, file_digests, manifest.to_json(), sign_hash)
    return signer.sign(os.path.basename(root), resources, sign_hash, allow_symlinks)


@dataclass(frozen=True)
class SignatureCheck:
    """The outcome of ``check_signature``: ``manifest`` is set exactly when nothing is wrong.

    ``manifest`` is parsed from the very bytes whose digest the signature carries,
    so a caller that goes on with it cannot be handed another manifest in between.
    """

    manifest: Manifest | None
    #: Each a ``Problem`` of kind ``signature``, as ``verify`` reports problems.
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def check_signature(folder: str | os.PathLike[str], trusted: TrustedKey) -> SignatureCheck:
    """Check ``folder/model.sig`` against ``trusted`` and ``folder/ckptpub.json``, reading nothing else.

    The signature must verify with ``trusted``, be a ``files`` serialization with
    SHA-256 or BLAKE3 (every file listed with that one), carry that digest of the
    ``ckptpub.json`` read here, and name exactly
    the manifest's files (but the git paths model_signing leaves out) plus
    ``ckptpub.json``. The files' own bytes are not read: the manifest's BLAKE3
    digests cover them and ``verify`` (or the vLLM loader) checks those.

    Returns the problems found (a mismatch). Raises ``NoManifestError`` when there is
    no manifest, and ``CkptpubError`` when there is no signature, or the signature,
    manifest, key or chain cannot be used at all.
    """
    root = as_path(folder, "folder")
    if not isinstance(trusted, TrustedKey):
        raise CkptpubError(f"trusted: expected a TrustedKey, got {type(trusted).__name__}")
    from . import signing_backend

    # The key first: one that cannot be used is said whatever the folder holds.
    verifier = signing_backend.load_verifier(trusted.public_key, trusted.certificate_chain)
    signature = _read_small(root, SIGNATURE_NAME, MAX_SIGNATURE_BYTES)
    if signature is None:
        raise CkptpubError(
            f"{root}: no {SIGNATURE_NAME}, so it is not signed; publish it with --sign KEY (sign=...)"
        )
    manifest_bytes = _read_small(root, MANIFEST_NAME, MAX_MANIFEST_BYTES)
    if manifest_bytes is None:
        raise NoManifestError(f"{root}: no {MANIFEST_NAME}; run 'ckptpub publish' on it first")
    statement = signing_backend.verify_bundle(signature, verifier, SIGNATURE_NAME)
    if isinstance(statement, str):
        return SignatureCheck(None, (Problem(SIGNATURE_NAME, "signature", statement),))
    sign_hash = statement.serialization.get("hash_type")
    if statement.serialization.get("method") != "files" or sign_hash not in SIGN_HASHES:
        detail = (
            f"signs a {statement.serialization.get('method')!r} serialization with {sign_hash!r}, "
            f"not 'files' with one of {', '.join(map(repr, SIGN_HASHES))}"
        )
        return SignatureCheck(None, (Problem(SIGNATURE_NAME, "signature", detail),))
    problems = []
    signed_manifest = statement.resources.get(MANIFEST_NAME)
    if signed_manifest != (sign_hash, digest_of(manifest_bytes, sign_hash)):
        what = "is not among the signed files" if signed_manifest is None else "differs from the one signed"
        problems.append(Problem(MANIFEST_NAME, "signature", what))
    if problems:  # the manifest is not the signed one: nothing it lists can be trusted
        return SignatureCheck(None, tuple(problems))
    manifest = parse_manifest(manifest_bytes, os.path.join(root, MANIFEST_NAME))
    listed = {r.path for r in manifest.files if not is_unsigned_path(r.path)} | {MANIFEST_NAME}
    for path in sorted(listed - set(statement.resources)):
        problems.append(Problem(path, "signature", f"listed in {MANIFEST_NAME} but not signed"))
    for path in sorted(set(statement.resources) - listed):
        problems.append(Problem(path, "signature", f"signed but not listed in {MANIFEST_NAME}"))
    for path, (algorithm, _) in sorted(statement.resources.items()):
        if algorithm != sign_hash:  # model_signing's verifier would refuse it: one algorithm throughout
            problems.append(Problem(path, "signature", f"signed with {algorithm}, not {sign_hash}"))
    return SignatureCheck(None if problems else manifest, tuple(problems))


def read_trusted_manifest(folder: str | os.PathLike[str], trusted: TrustedKey | None) -> Manifest:
    """The manifest to go on with: the one ``trusted`` signed, or (``trusted`` None) the folder's own.

    "Signed or plain" is decided here, once: with a key, anything but a signature of
    exactly this manifest by that key is a ``CkptpubError`` naming the first problem
    (and how many more), and the manifest returned is parsed from the bytes the
    signature covers; without one, it is ``read_manifest(folder)``.
    """
    if trusted is None:
        return read_manifest(folder)
    check = check_signature(folder, trusted)
    if check.manifest is None:
        first = check.problems[0]
        raise CkptpubError(
            and_more(
                f"{as_path(folder, 'folder')}: not what the trusted key signed: {first.path}: {first.detail}",
                len(check.problems) - 1,
            )
        )
    return check.manifest


def verify_signed(
    folder: str | os.PathLike[str],
    trusted: TrustedKey,
    *,
    expect_identity: str | None = None,
    threads: int | None = None,
    use_mmap: bool = True,
    on_progress: ProgressCallback | None = None,
    hasher: SpanHasher | None = None,
) -> VerifyReport:
    """``check_signature``, then ``ckptpub.verify``: the signature covers exactly this manifest, and
    the folder matches it byte for byte.

    Signature problems come first in the report (kind ``signature``); the bytes are
    checked either way, so a report names every difference. Raises what both raise.
    ``hasher`` is ``verify``'s (a ``distributed.DistributedHasher`` spreads the bytes
    over a job's ranks; each rank checks the signature itself, which reads two small files).
    """
    check = check_signature(folder, trusted)
    report = verify(
        folder,
        expect_identity=expect_identity,
        threads=threads,
        use_mmap=use_mmap,
        on_progress=on_progress,
        hasher=hasher,
    )
    problems = list(check.problems)
    if check.manifest is not None and report.manifest != check.manifest:
        problems.append(Problem(MANIFEST_NAME, "signature", "replaced while the folder was verified"))
    return report._replace(problems=(*problems, *report.problems))


def _read_small(root: str, name: str, limit: int) -> bytes | None:
    """The bytes of the regular file ``root/name`` (``read_bounded``); None when nothing is there."""
    path = os.path.join(root, name)
    try:
        return read_bounded(path, limit, path)
    except OpenError as error:
        if error.absent:
            return None
        raise
