"""SGLang's disk loading verified: every tensor its weight iterators yield checked as it streams.

Every disk load of SGLang's ``DefaultModelLoader`` goes through its
``_get_weights_iterator`` (an engine started without the weight cache, the weight cache's
fallback in client mode, and the daemon's own load), which yields ``(name, tensor)``
from the shards with the stored dtype and bytes. The plugin wraps what it returns
(an AROUND hook of SGLang's hook registry): for a folder with a manifest in force
(``decision``), each tensor is checked by the core's ``StreamVerifier`` (name, dtype and
shape at once, the bytes beside SGLang's copying), and the model gets the private
copy that was hashed, so a write to a shard between check and use cannot slip in (the
copies go into buffers reused once nothing holds them: ``serving_torch.StagingBuffers``). A
difference is a ``RefusedError`` naming the tensor; a tensor the manifest has that never
arrived is refused at the end of the stream. When reading a shard fails, the shards are
compared with the manifest then (``shard_problems``), so the refusal names the file.

Each rank of a tensor-parallel engine reads every tensor and hashes it (the vLLM
plugin's split of the hashing between the ranks of a node is not carried over).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

import ckptpub
from ckptpub.serving import RefusedError, StreamVerifier, check_shards_are_files, shard_problems
from ckptpub.serving_torch import StagingBuffers, dtype_code, tensor_bytes

from .decision import decide
from .log import logger

#: SGLang's disk loader's weight stream, wrapped by :func:`verified_weights`.
TARGET = "sglang.srt.model_loader.loader.DefaultModelLoader._get_weights_iterator"


class TensorVerifier(StreamVerifier):
    """The core's ``StreamVerifier`` for torch tensors: :meth:`stream` over SGLang's weight iterator."""

    def __init__(self, folder: str, manifest: ckptpub.Manifest) -> None:
        super().__init__(folder, manifest)
        self.staging = StagingBuffers(keep_bytes=self.max_pending_bytes)

    def stream(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """Each ``(name, tensor)`` checked, with the copy that was hashed in place of the tensor; ``finish``
        at the end (a missing tensor refused there)."""
        iterator = iter(weights)
        try:
            while True:
                try:
                    name, tensor = next(iterator)
                except StopIteration:
                    break
                except RefusedError:
                    raise
                except Exception as error:  # noqa: BLE001 - whatever the shard reader raised: name the shard
                    problems = shard_problems(self.folder, self.manifest)
                    reason = (
                        problems[0] if problems else f"reading the weights failed: {type(error).__name__}"
                    )
                    raise self.refuse(reason) from error
                yield name, self.check(name, tensor)
            self.finish()
            logger.info(
                "ckptpub: verified %d tensors (%d bytes) of %s against %s",
                self.verified_tensors,
                self.verified_bytes,
                self.folder,
                self.identity,
            )
        finally:
            self.close()

    def check(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Check one tensor from disk; return the private copy whose bytes were hashed (load that one)."""
        self.expect(name, dtype_code(tensor.dtype), tuple(tensor.shape))
        loaded = self.staging.copy_of(tensor)  # out of the shard's mapping, into memory of our own
        self.hash(name, tensor_bytes(loaded))
        return loaded

    def close(self) -> None:
        super().close()
        self.staging.release()


def verified_weights(
    original: Callable[..., Any], loader: Any, source: Any, *args: Any, **kwargs: Any
) -> Any:
    """The AROUND hook of :data:`TARGET`: SGLang's stream, verified when a manifest speaks for the folder."""
    found = decide(source.model_or_path, source.revision)
    if found.manifest is None:
        return original(loader, source, *args, **kwargs)
    if source.prefix or loader.load_config.draft_model_idx is not None:
        raise RefusedError(
            found.folder,
            "SGLang loads its tensors renamed (a prefix or a draft model's layer): not verifiable",
        )
    check_shards_are_files(found.folder)
    verifier = TensorVerifier(found.folder, found.manifest)
    return verifier.stream(original(loader, source, *args, **kwargs))
