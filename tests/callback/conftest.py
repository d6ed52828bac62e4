"""Fixtures for the Trainer-callback tests (helpers live in cbhelpers.py)."""

from __future__ import annotations

import cbhelpers
import pytest


@pytest.fixture(scope="session")
def tokenizer():
    return cbhelpers.train_tiny.build_tokenizer()


@pytest.fixture
def tiny():
    return cbhelpers.train_tiny


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
