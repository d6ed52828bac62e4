"""Fixtures for the Trainer-callback tests (helpers live in cbhelpers.py and tests/support)."""

from __future__ import annotations

import os

import pytest
from support import tiny_model

# for this process and the training scripts the tests start
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_model.build_tokenizer()


@pytest.fixture
def tiny():
    return tiny_model


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The tiny model gains nothing from more threads, and on a shared two-core machine
    two OpenMP threads wait on each other whenever another job takes a core (20x
    slower steps were seen). Restored afterwards for other test folders."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
