"""vLLM's two reads of an adapter, served from the bytes ckptpub checked (see ``adapters``).

``PEFTHelper.from_local_dir`` opens ``adapter_config.json`` with ``open`` (a name
looked up in ``vllm.lora.peft_helper``), and ``LoRAModel.from_local_checkpoint``
opens ``adapter_model.safetensors`` with ``safetensors.safe_open`` (looked up in
``vllm.lora.lora_model``). :func:`install` gives those two modules stand-ins that,
while :func:`served_from_memory` is active for an adapter, return that adapter's
checked config bytes and tensors, and otherwise call the real ones. vLLM's own
loading code then runs unchanged on exactly the bytes that were hashed: no second
read of a file a writer could change in between. Whether vLLM did read through them
is recorded (``config_read``, ``tensors_read``), so that a vLLM that reads otherwise
is refused instead of trusted.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import IO, Any

import torch

import ckptpub

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


@dataclass
class VerifiedAdapter:
    """An adapter's files as read and checked, which vLLM's two reads are then served from.

    ``folder``: where they were read (the resolved folder); ``served_as``: the folder as
    vLLM names it while it loads (set by :func:`served_from_memory`)."""

    folder: str
    manifest: ckptpub.Manifest
    config: bytes
    tensors: dict[str, torch.Tensor]
    config_read: bool = False
    tensors_read: bool = False
    served_as: str = ""

    @property
    def config_path(self) -> str:
        return os.path.join(self.served_as, CONFIG_FILE)

    @property
    def weights_path(self) -> str:
        return os.path.join(self.served_as, WEIGHTS_FILE)

    @property
    def size(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


_reading: ContextVar[VerifiedAdapter | None] = ContextVar("ckptpub_adapter_reading", default=None)


@contextlib.contextmanager
def served_from_memory(adapter: VerifiedAdapter, served_as: str) -> Iterator[None]:
    """While vLLM loads ``adapter`` from the folder it names ``served_as``, its reads of the
    adapter's two files there return the checked bytes (no file is opened)."""
    adapter.served_as = served_as
    token = _reading.set(adapter)
    try:
        yield
    finally:
        _reading.reset(token)


def _open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> IO[Any]:
    """``open`` as ``vllm.lora.peft_helper`` sees it: the checked ``adapter_config.json`` while one loads."""
    adapter = _reading.get()
    if adapter is None or os.fspath(file) != adapter.config_path or mode not in ("r", "rb", "rt"):
        return builtins.open(file, mode, *args, **kwargs)
    adapter.config_read = True
    return io.BytesIO(adapter.config) if "b" in mode else io.StringIO(adapter.config.decode("utf-8"))


class _CheckedTensors:
    """What ``safetensors.safe_open`` returns to vLLM for the adapter being loaded: its checked tensors."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self._tensors = tensors

    def __enter__(self) -> _CheckedTensors:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def keys(self) -> list[str]:
        return list(self._tensors)

    def get_tensor(self, name: str) -> torch.Tensor:
        return self._tensors[name]


class _Safetensors:
    """The ``safetensors`` module as ``vllm.lora.lora_model`` sees it: ``safe_open`` of the
    adapter being loaded serves its checked tensors; everything else is the real module."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def safe_open(self, filename: Any, framework: str, device: str = "cpu") -> Any:
        adapter = _reading.get()
        if adapter is None or os.fspath(filename) != adapter.weights_path:
            return self._real.safe_open(filename, framework=framework, device=device)
        adapter.tensors_read = True
        return _CheckedTensors(adapter.tensors)


def install() -> None:
    """Give ``vllm.lora.peft_helper`` and ``vllm.lora.lora_model`` the two stand-ins (idempotent)."""
    from vllm.lora import lora_model, peft_helper

    if isinstance(lora_model.safetensors, _Safetensors):
        return
    peft_helper.open = _open
    lora_model.safetensors = _Safetensors(lora_model.safetensors)
