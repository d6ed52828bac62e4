"""Waiting for a verified stream's hash to let go of the copy it handed out (``StagingBuffers``).

A buffer is reused only once its hash is done. A test loader that copies each tensor and
drops it waits for that before it takes the next tensor (as a loader slower than the
hashing does): otherwise how many buffers are reused depends on how busy the cores are.
"""

from __future__ import annotations

import time

import torch

from ckptpub.serving_torch import StagingBuffers, storage_holders


def wait_until_only_the_pool_holds(tensor: torch.Tensor, limit_s: float = 60.0) -> None:
    """Wait until ``tensor``'s memory has no more holders than a copy a pool just made (hashed)."""
    pool = StagingBuffers(keep_bytes=0)
    settled = storage_holders(pool.copy_of(tensor))
    deadline = time.monotonic() + limit_s
    while storage_holders(tensor) > settled:
        assert time.monotonic() < deadline, "the hash of a tensor never let go of its copy"
        time.sleep(0.001)
