"""Fixtures for the Trainer-callback tests (helpers live in cbhelpers.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cbhelpers  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer():
    return cbhelpers.train_tiny.build_tokenizer()


@pytest.fixture
def tiny():
    return cbhelpers.train_tiny
