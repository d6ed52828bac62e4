"""Every tensor vLLM streams from disk checked against the manifest while it streams: torch's side.

vLLM's disk loader yields ``(name, tensor)`` pairs straight from the safetensors
files, with the stored dtype and bytes, and the model copies each into place. The
checks are the core's (``ckptpub.serving.StreamVerifier``: name, dtype and shape at
once, the bytes on a small thread pool beside vLLM's copying); :class:`TensorVerifier`
turns torch tensors into what it takes (``ckptpub.serving_torch``). It copies each
tensor's bytes out of the shard's mapping and hands vLLM that copy, the one it hashes,
so a write to the file cannot slip in between check and use; the copies go into a few
buffers reused once nothing holds them any more (``serving_torch.StagingBuffers``), so
they cost a copy, not fresh memory. When reading a shard fails (a damaged header, a
truncated file), the shards are compared with the manifest then, and only then
(``ckptpub.serving.shard_problems``), so the refusal names the file without an extra
pass on every start.

When several ranks load the model (tensor or pipeline parallel), each hashes only its
share of the tensors and the ranks agree on the outcome (``node_share``): every tensor
is hashed once per node, and every rank refuses when any rank finds a difference.
A rank that leaves a tensor to another still hands vLLM its own private copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import torch

import ckptpub
from ckptpub.distributed import ExchangeError
from ckptpub.serving import RefusedError, StreamVerifier, shard_problems
from ckptpub.serving_torch import StagingBuffers, dtype_code, tensor_bytes

from . import node_share
from .node_share import Peers


class TensorVerifier(StreamVerifier):
    """The core's ``StreamVerifier`` for torch tensors: use :meth:`wrap` on the weight iterator, then
    :meth:`finish`.

    With ``peers`` (the ranks loading the model together, ``node_share.Peers``), call
    :meth:`share` before the stream: every rank must, and each then hashes its share
    only (all of it with ``share_hashing=False``); refusals are agreed with the peers.
    ``private``: the loader yields tensors in memory of their own already (vLLM's object-store
    streamer yields clones), so each is hashed and handed on as it is, not copied again.
    """

    def __init__(
        self,
        folder: str,
        manifest: ckptpub.Manifest,
        *,
        threads: int = 2,
        max_pending_mib: int = 2048,
        kind: str = "",
        peers: Peers | None = None,
        share_hashing: bool = True,
        private: bool = False,
    ) -> None:
        super().__init__(
            folder, manifest, threads=threads, max_pending_bytes=max_pending_mib << 20, kind=kind
        )
        self.helpers = 1  # ranks of this node hashing the tensors this rank sees, itself included
        self._peers = peers
        self._share_hashing = share_hashing
        self._private = private
        self._staging = StagingBuffers(keep_bytes=self.max_pending_bytes)
        self._reading: bytes | None = None  # the shards' fingerprint when the share was planned
        self._agreed = peers is None

    def share(self, reads: int = node_share.READS_ALL, sees: Callable[[str], bool] | None = None) -> None:
        """Plan with the peers which tensors this rank hashes (collective: every rank calls it once).

        ``reads`` says what this rank will see (``node_share.READS_*``), ``sees`` which
        tensors for ``READS_LISTED``.
        """
        if self._peers is None:
            return
        with self._told_to_peers():
            shards = self.manifest.weights
            fingerprint = node_share.reading_fingerprint(self.folder, shards)
            if not self._share_hashing or (reads == node_share.READS_LISTED and sees is None):
                reads = node_share.READS_UNKNOWN  # take no share: hash everything seen here
            sizes = {
                t.name: t.data_offsets[1] - t.data_offsets[0]
                for t in self.manifest.tensors
                if t.name in self.expected
            }
            try:
                planned = node_share.plan(self._peers, self.manifest, sizes, fingerprint, sees, reads)
            except ExchangeError as error:
                raise self.refuse(str(error)) from None
            except RefusedError as error:
                raise self.refuse(error.reason) from None
            self.assign(planned.mine)
            self.helpers = planned.helpers
            self._reading = fingerprint if planned.mine is not None else None

    def wrap(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        iterator = iter(weights)
        with self._told_to_peers():
            while True:
                try:
                    name, tensor = next(iterator)
                except StopIteration:
                    self._staging.release()
                    return
                except RefusedError:
                    raise
                except Exception as error:  # noqa: BLE001 - whatever the shard reader raised: name the shard
                    raise self.refuse(self.reading_failed(error)) from error
                yield name, self.check(name, tensor)

    @contextlib.contextmanager
    def _told_to_peers(self) -> Iterator[None]:
        """A refusal raised inside is told to the peers, once, before it propagates (they refuse too)."""
        try:
            yield
        except RefusedError as error:
            self.close()
            if not self._agreed:
                self._agreed = True
                assert self._peers is not None
                with contextlib.suppress(ExchangeError):  # refusing anyway; a dead peer cannot be told
                    self._peers.agree(error.reason)
            raise

    def reading_failed(self, error: Exception) -> str:
        """Why reading the shards failed, by shard name where the files show it."""
        problems = shard_problems(self.folder, self.manifest)
        if problems:
            return problems[0]
        return "reading the weights failed: " + " ".join(f"{type(error).__name__}: {error}".split())

    def check(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Check one tensor from disk; return the copy to load into the model (use it, not ``tensor``).

        Name, dtype and shape are checked now, the bytes' digest now or on the pool.
        What is hashed is a private copy (in a reused buffer: ``StagingBuffers``), and that copy is
        what the model gets: the bytes verified are the bytes loaded, whatever is written to the
        shard between this check and vLLM's copy into the model (checking the mapped
        view itself left that window open: a ``pwrite`` in between put unverified bytes
        into the model while the check passed). A tensor another rank of this node hashes
        (``share``) is copied all the same: the model then holds bytes read once, between
        the share's plan and ``finish``, and ``finish`` refuses unless the shards are the
        very files, unchanged, that the hashing rank read in that time.
        """
        hashed_here = self.expect(name, dtype_code(tensor.dtype), tuple(tensor.shape))
        loaded = tensor if self._private else self._staging.copy_of(tensor)
        if hashed_here:
            self.hash(name, tensor_bytes(loaded))
        return loaded

    def close(self) -> None:
        super().close()
        self._staging.release()

    def finish(self) -> None:
        """Wait for the last hashes; refuse if tensors are missing; agree with the peers. Idempotent."""
        with self._told_to_peers():
            super().finish()
            if self._reading is not None and self._reading != node_share.reading_fingerprint(
                self.folder, self.manifest.weights
            ):  # the digests of other ranks vouch only for the files they and this rank read
                raise self.refuse("a weight shard changed on storage while it was being loaded")
        if not self._agreed:
            self._agreed = True
            assert self._peers is not None
            try:
                other = self._peers.agree(None)
            except ExchangeError as error:
                raise self.refuse(str(error)) from None
            if other is not None:
                raise self.refuse(other)
