"""Every tensor a loader streams checked against the manifest while it streams: name, dtype, shape, bytes.

A loader yields tensors one by one from the shards (vLLM's and SGLang's disk loaders
both do) and copies each into its model. ``StreamVerifier`` takes each as the loader
yields it: ``expect`` checks its name, dtype and shape at once (a tensor not in the
manifest, or read twice, is refused by name), ``hash`` checks its bytes, small tensors on
the loading thread and large ones on a few threads (BLAKE3 releases the GIL), so hashing
overlaps the loader's copying instead of adding a second pass over the checkpoint.
Loading pauses only when more than ``max_pending_bytes`` wait for their hash.
``finish`` waits for the last hashes and refuses when a manifest tensor never arrived.

The guarantee "the bytes verified are the bytes loaded" is the integration's to keep
in one way only: the bytes it hands to ``hash`` are its own private copy (not a view
of a file mapping, which a write to the file would change between the check and the
use), and that copy is what its model gets. Nothing here imports torch: the
integration turns its tensors into bytes.

When several ranks of a node load one model, each hashes a share
(``assign``): a tensor another rank hashes is still expected, by name, dtype and shape.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from .._format.digest import digest_bytes
from .._format.manifest import Manifest
from .refusal import RefusedError

#: Tensors up to this size are hashed on the loading thread: BLAKE3 takes a few microseconds
#: for them, less than handing them to the pool (and ``blake3`` keeps the GIL under 2 KiB
#: anyway). A mixture of experts has tens of thousands of them.
INLINE_HASH_BYTES = 64 << 10

#: A tensor's bytes as an integration hands them over.
Bytes = bytes | bytearray | memoryview


class StreamVerifier:
    """Verifies one folder's tensors as they stream: ``expect`` then ``hash`` each, then ``finish``.

    ``folder`` and ``kind`` name what is refused. ``threads`` hash large tensors;
    ``max_pending_bytes`` bounds the bytes waiting for them.
    """

    def __init__(
        self,
        folder: str,
        manifest: Manifest,
        *,
        threads: int = 2,
        max_pending_bytes: int = 2 << 30,
        kind: str = "",
    ) -> None:
        self.folder = folder
        self.kind = kind
        self.manifest = manifest
        self.identity = manifest.identity
        self.expected = manifest.model()  # what the identity covers: dtype, shape, digest by name
        self.seen: set[str] = set()
        self.partial_reason: str | None = None
        self.verified_tensors = 0  # hashed here and matching
        self.verified_bytes = 0
        self.mine: frozenset[str] | None = None  # None: hash every tensor seen
        self.max_pending_bytes = max_pending_bytes  # also what an integration keeps of free copy buffers
        self._pending: deque[tuple[list[str], Future[list[str]], list[int]]] = deque()
        self._pending_bytes = 0
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="ckptpub-verify")

    @property
    def total_tensors(self) -> int:
        """The tensors the manifest's identity covers (the M of "verified N of M")."""
        return len(self.expected)

    def refuse(self, what: str, more: int = 0) -> RefusedError:
        """The refusal of this folder for ``what``, naming the identity it was checked against."""
        return RefusedError(
            self.folder, what, more=more, hint=f"the manifest's identity is {self.identity}", kind=self.kind
        )

    def assign(self, mine: frozenset[str] | None) -> None:
        """Hash only ``mine`` (the others are another rank's share); None: hash every tensor seen."""
        self.mine = mine

    def expect(self, name: str, dtype: str, shape: Sequence[int]) -> bool:
        """Check a streamed tensor's name, dtype (a safetensors code) and shape; whether its bytes are
        this rank's to ``hash`` (false only for another rank's share)."""
        record = self.expected.get(name)
        if record is None:
            raise self.refuse(f"tensor {name!r} is not in the manifest")
        if name in self.seen:
            raise self.refuse(f"tensor {name!r} was read twice")
        self.seen.add(name)
        if dtype != record.dtype:
            raise self.refuse(f"tensor {name!r} has dtype {dtype}, the manifest says {record.dtype}")
        if tuple(shape) != tuple(record.shape):
            raise self.refuse(
                f"tensor {name!r} has shape {list(shape)}, the manifest says {list(record.shape)}"
            )
        return self.mine is None or name in self.mine

    def hash(self, name: str, data: Bytes) -> None:
        """Check the bytes of the tensor ``expect`` just admitted: now, or on the pool for a large one.

        ``data`` is the integration's private copy, the one its model gets; it must not
        change until ``finish``. A difference is refused naming the tensor, here or in a
        later call.
        """
        size = _size(data)
        if size <= INLINE_HASH_BYTES:
            self._compare(name, digest_bytes(data), size)
            return
        self.hash_together([(name, data)])

    def hash_together(self, tensors: Sequence[tuple[str, Bytes]]) -> None:
        """Check the bytes of several admitted tensors as one job on the pool (as :meth:`hash` does one).

        For many tensors of a few hundred KiB that lie together in memory (an
        adapter's): handing each to the pool costs as much as hashing it.
        """
        names, data = [name for name, _ in tensors], [bytes_ for _, bytes_ in tensors]
        sizes = [_size(bytes_) for bytes_ in data]
        self._pending.append((names, self._pool.submit(_digests, data), sizes))
        self._pending_bytes += sum(sizes)
        self._collect(block=False)
        while self._pending_bytes > self.max_pending_bytes and self._pending:
            self._collect_one()

    def mark_partial(self, reason: str) -> None:
        """The loader reads only part of the checkpoint on purpose (e.g. expert parallelism)."""
        self.partial_reason = reason

    def finish(self) -> None:
        """Wait for the last hashes; refuse if a tensor is missing or one of this rank's share never came.

        When it returns, no hashing thread holds the caller's memory any more (the
        threads are joined), so memory reused once nothing holds it is free at once.
        """
        try:
            self._collect(block=True)
            self._pool.shutdown(wait=True)
        finally:
            self.close()
        missing = sorted(set(self.expected) - self.seen)
        if missing and self.partial_reason is None:
            raise self.refuse(
                f"manifest tensor {missing[0]!r} never arrived from disk", more=len(missing) - 1
            )
        unhashed = sorted(self.mine - self.seen) if self.mine is not None else []
        if unhashed:  # the other ranks counted on this one for them
            raise self.refuse(
                f"tensor {unhashed[0]!r}, this rank's to hash, never arrived", more=len(unhashed) - 1
            )

    def close(self) -> None:
        """Stop hashing (a refusal, or the end); pending hashes are dropped."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _collect(self, block: bool) -> None:
        while self._pending and (block or self._pending[0][1].done()):
            self._collect_one()

    def _collect_one(self) -> None:
        names, future, sizes = self._pending.popleft()
        self._pending_bytes -= sum(sizes)
        for name, digest, size in zip(names, future.result(), sizes, strict=True):
            self._compare(name, digest, size)

    def _compare(self, name: str, digest: str, size: int) -> None:
        record = self.expected[name]
        if digest != record.digest:
            self.close()
            raise self.refuse(
                f"tensor {name!r} differs from the manifest (bytes hash to {digest[:19]}..., "
                f"the manifest says {record.digest[:19]}...)"
            )
        self.verified_tensors += 1
        self.verified_bytes += size


def _size(data: Bytes) -> int:
    return data.nbytes if isinstance(data, memoryview) else len(data)


def _digests(data: list[Bytes]) -> list[str]:
    """The digests of a run of tensors, in order: one job on the pool."""
    return [digest_bytes(bytes_) for bytes_ in data]
