"""Fixtures for the signing tests: key pairs, a certificate chain and a signed checkpoint to copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support import signhelpers  # noqa: E402


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, signhelpers.KeyPair]:
    """The training job's key and another one (a stranger's)."""
    folder = tmp_path_factory.mktemp("keys")
    return {name: signhelpers.make_key(folder, name) for name in ("trainer", "stranger")}


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, signhelpers.CertificateSet]:
    folder = tmp_path_factory.mktemp("certificates")
    return {name: signhelpers.make_certificates(folder, name) for name in ("company", "other")}


@pytest.fixture(scope="session")
def signed_original(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, signhelpers.KeyPair]) -> Path:
    """A checkpoint (two shards, an index, a subfolder, a .gitattributes) published and signed once."""
    folder = tmp_path_factory.mktemp("original") / "checkpoint-20"
    signhelpers.write_signable_checkpoint(folder)
    signhelpers.publish_signed(folder, keys["trainer"].private)
    return folder


@pytest.fixture(scope="session")
def signed_blake3_original(
    tmp_path_factory: pytest.TempPathFactory, keys: dict[str, signhelpers.KeyPair]
) -> Path:
    """The same checkpoint signed with BLAKE3 file digests (``sign_hash="blake3"``)."""
    folder = tmp_path_factory.mktemp("original-blake3") / "checkpoint-20"
    signhelpers.write_signable_checkpoint(folder)
    signhelpers.publish_signed(folder, keys["trainer"].private, sign_hash="blake3")
    return folder


@pytest.fixture
def signed(tmp_path: Path, signed_original: Path) -> Path:
    """A fresh copy of the signed checkpoint, for a test to change."""
    return Path(shutil.copytree(signed_original, tmp_path / signed_original.name, symlinks=True))


@pytest.fixture
def signed_blake3(tmp_path: Path, signed_blake3_original: Path) -> Path:
    """A fresh copy of the BLAKE3-signed checkpoint, for a test to change."""
    return Path(
        shutil.copytree(signed_blake3_original, tmp_path / signed_blake3_original.name, symlinks=True)
    )
