"""Reused memory for the private copies a verified load hands to its engine.

A verified load copies every tensor out of the shard's mapping into memory of its own,
hashes that copy and gives it to the engine, so that the bytes verified are the bytes
loaded (the vLLM plugin's ``verify_stream``, the SGLang plugin's ``loader``). In fresh
memory each copy pays a page fault per 4 KiB written, and those faults, not the copy,
were most of what verification added to a load (allocating 320 MB alone took 0.20-0.24 s
here). A model's tensors come in a few sizes repeated layer after layer, and an engine
copies each into its parameter and lets go of it within a tensor or two, so a handful of
buffers, touched once, serve a whole load.

A buffer is written again only when nothing but this pool holds its memory. torch
counts the holders of a tensor's storage: every tensor or view of it, and what holds
one (the ``memoryview`` a pending hash reads, a parameter that the engine set to the
tensor itself instead of copying it). So a copy is never overwritten while it is being
hashed or while anything can still read it, and a copy that the engine keeps is simply
never reused. The count is torch's ``torch._C._storage_Use_Count`` (its CUDA-graph trees
check storages the same way); a torch without it gets fresh memory every time. Only
views made by torch are counted: memory reached through a raw pointer (``torch.frombuffer``
over a buffer's ``numpy()``) is not, so nothing handed out is made that way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from .._serving.stream import INLINE_HASH_BYTES

_storage_use_count: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)


def storage_holders(tensor: torch.Tensor) -> int:
    """How many tensors and storage objects hold ``tensor``'s memory (its own included)."""
    assert _storage_use_count is not None
    storage = tensor.untyped_storage()
    return _storage_use_count(storage._cdata) - 1  # less the ``storage`` object just made


def fresh_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``tensor`` in newly allocated memory."""
    return tensor.detach().clone(memory_format=torch.contiguous_format)


class StagingBuffers:
    """Private memory for CPU tensors, in buffers reused once nothing else holds them.

    ``keep_bytes`` bounds the free buffers kept for reuse; :meth:`release` lets go of
    every buffer (a load streamed its last tensor). Safe to share between threads (the
    vLLM plugin's adapters share one per process).
    """

    def __init__(self, keep_bytes: int) -> None:
        self.keep_bytes = keep_bytes
        self.reused = 0  # copies made into a buffer used before
        self.allocated = 0  # buffers allocated
        self._lent: list[torch.Tensor] = []  # buffers holding a copy handed out
        self._free: list[torch.Tensor] = []  # buffers nothing else holds, the oldest first
        self._free_bytes = 0
        self._lock = threading.Lock()

    def copy_of(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of ``tensor`` that only this process writes: the tensor itself when it is
        on an accelerator (a copy of its own already)."""
        if tensor.device.type != "cpu":
            return tensor
        if tensor.nbytes <= INLINE_HASH_BYTES:  # a small copy: from malloc's heap, touched already
            return fresh_copy(tensor)
        copy = self.lend(tensor.nbytes).view(tensor.dtype).view(tensor.shape)
        copy.copy_(tensor.detach())
        return copy

    def lend(self, size: int) -> torch.Tensor:
        """``size`` bytes (``uint8``) of a buffer nothing else holds: one used before when one fits
        (``size`` up to a sixteenth more), else new. Views of it, made by torch, hold it."""
        if _storage_use_count is None:
            return torch.empty(size, dtype=torch.uint8)
        with self._lock:
            self._take_back()
            buffer = self._free_buffer(size)
            if buffer is None:
                self.allocated += 1
                buffer = torch.empty(size, dtype=torch.uint8)
            self._lent.append(buffer)
            return buffer[:size]

    def release(self) -> None:
        """Let go of every buffer: what the engine or a pending hash still holds lives on, the rest is
        freed."""
        with self._lock:
            self._lent.clear()
            self._free.clear()
            self._free_bytes = 0

    def _take_back(self) -> None:
        """Move the lent buffers that only this pool holds now to the free list, within ``keep_bytes``."""
        still_lent = []
        for buffer in self._lent:
            if storage_holders(buffer) > 1:
                still_lent.append(buffer)
            else:
                self._free.append(buffer)
                self._free_bytes += buffer.nbytes
        self._lent = still_lent
        while self._free_bytes > self.keep_bytes:
            self._free_bytes -= self._free.pop(0).nbytes

    def _free_buffer(self, size: int) -> torch.Tensor | None:
        """The most recently freed buffer that fits ``size`` bytes without wasting a sixteenth."""
        for index in range(len(self._free) - 1, -1, -1):
            if size <= self._free[index].nbytes <= size + size // 16:
                self.reused += 1
                buffer = self._free.pop(index)
                self._free_bytes -= buffer.nbytes
                return buffer
        return None
