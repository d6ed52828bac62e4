"""Check every tensor vLLM streams from disk against the manifest, while it streams.

vLLM's disk loader yields ``(name, tensor)`` pairs straight from the safetensors
files, with the stored dtype and bytes, and the model copies each into place. The
verifier checks name, dtype and shape at once, copies the bytes out of the shard's
mapping (the copy is what vLLM then loads, so a write to the file cannot slip in
between check and use) and hands the copy to a small thread pool (BLAKE3 releases
the GIL), so hashing overlaps with vLLM's copying instead of adding a second pass
over the checkpoint. Loading pauses only when more
than ``max_pending_mib`` of tensors wait for their hash. Any difference raises
:class:`RefusedError` naming the tensor; ``finish`` waits for the last hashes and
also refuses when manifest tensors never arrived. When reading a shard fails (a
damaged header, a truncated file), the shards are compared with the manifest then,
and only then, so the refusal names the file without an extra pass on every start.

When several ranks load the model (tensor or pipeline parallel), each hashes only its
share of the tensors and the ranks agree on the outcome (``node_share``): every tensor
is hashed once per node, and every rank refuses when any rank finds a difference.
A rank that leaves a tensor to another still hands vLLM its own private copy.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch

import ckptpub
from ckptpub.distributed import ExchangeError

from . import node_share
from .errors import RefusedError
from .folder_reads import UnreadableError, read_prefix, resolve_inside
from .node_share import Peers

# safetensors dtype codes (what the manifest records) of torch dtypes.
_DTYPE_CODES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
for _name, _code in (
    ("uint16", "U16"),
    ("uint32", "U32"),
    ("uint64", "U64"),
    ("float8_e4m3fn", "F8_E4M3"),
    ("float8_e5m2", "F8_E5M2"),
    ("float8_e8m0fnu", "F8_E8M0"),
):
    if hasattr(torch, _name):
        _DTYPE_CODES[getattr(torch, _name)] = _code


_TORCH_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}


def dtype_code(dtype: torch.dtype) -> str:
    return _DTYPE_CODES.get(dtype, str(dtype).removeprefix("torch."))


def torch_dtype(code: str) -> torch.dtype | None:
    """The torch dtype of a safetensors dtype code, or None when torch has none (``F4``, ``C64``...)."""
    return _TORCH_DTYPES.get(code)


def private_copy(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes in memory only this process writes: a contiguous copy of a CPU tensor.

    vLLM's CPU tensors from disk are views of the shard's shared mapping, so a write to
    the file (``pwrite``, another process's mapping) shows in them at any moment; a
    tensor on an accelerator is already a copy of its own.
    """
    if tensor.device.type != "cpu":
        return tensor
    return tensor.detach().clone(memory_format=torch.contiguous_format)


def raw_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes as stored (a zero-copy view for CPU tensors)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def small_bytes(tensor: torch.Tensor) -> bytes:
    """A copy of a small tensor's bytes, made without ``raw_bytes``' five intermediate objects.

    A mixture of experts streams tens of thousands of tensors of a few KiB; for them the
    detach, reshape, view, array and memoryview cost three times the hash itself. A
    contiguous CPU tensor's bytes lie at ``data_ptr()``, ``nbytes`` long: copied out in
    one call while the caller holds the tensor.
    """
    if tensor.is_cpu and tensor.is_contiguous():
        return ctypes.string_at(tensor.data_ptr(), tensor.nbytes)
    return bytes(raw_bytes(tensor))


#: Tensors up to this size are hashed on the loading thread: BLAKE3 takes a few microseconds
#: for them, less than handing them to the pool (and ``blake3`` keeps the GIL under 2 KiB
#: anyway). A mixture of experts has tens of thousands of them.
INLINE_HASH_BYTES = 64 << 10


class StreamVerifier:
    """Verifies one folder's tensors; use :meth:`wrap` on the weight iterator, then :meth:`finish`.

    With ``peers`` (the ranks loading the model together, ``node_share.Peers``), call
    :meth:`share` before the stream: every rank must, and each then hashes its share
    only (all of it with ``share_hashing=False``); refusals are agreed with the peers.
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
        self.helpers = 1  # ranks of this node hashing the tensors this rank sees, itself included
        self._peers = peers
        self._share_hashing = share_hashing
        self._mine: frozenset[str] | None = None  # None: hash every tensor seen
        self._reading: bytes | None = None  # the shards' fingerprint when the share was planned
        self._agreed = peers is None
        self._max_pending = max_pending_mib << 20
        self._pending: deque[tuple[str, Future[str], int]] = deque()
        self._pending_bytes = 0
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="ckptpub-verify")

    @property
    def total_tensors(self) -> int:
        """The tensors the manifest's identity covers (the M of "verified N of M")."""
        return len(self.expected)

    def refuse(self, what: str, more: int = 0) -> RefusedError:
        return RefusedError(
            self.folder, what, more=more, hint=f"the manifest's identity is {self.identity}", kind=self.kind
        )

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
            self._mine, self.helpers = planned.mine, planned.helpers
            self._reading = fingerprint if planned.mine is not None else None

    def wrap(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        iterator = iter(weights)
        with self._told_to_peers():
            while True:
                try:
                    name, tensor = next(iterator)
                except StopIteration:
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
        What is hashed is a private copy (``private_copy``), and that copy is what the
        model gets: the bytes verified are the bytes loaded, whatever is written to the
        shard between this check and vLLM's copy into the model (checking the mapped
        view itself left that window open: a ``pwrite`` in between put unverified bytes
        into the model while the check passed). A tensor another rank of this node hashes
        (``share``) is copied all the same: the model then holds bytes read once, between
        the share's plan and ``finish``, and ``finish`` refuses unless the shards are the
        very files, unchanged, that the hashing rank read in that time.
        """
        record = self.expected.get(name)
        if record is None:
            raise self.refuse(f"tensor {name!r} is not in the manifest")
        if name in self.seen:
            raise self.refuse(f"tensor {name!r} was read twice")
        self.seen.add(name)
        got_dtype = dtype_code(tensor.dtype)
        if got_dtype != record.dtype:
            raise self.refuse(f"tensor {name!r} has dtype {got_dtype}, the manifest says {record.dtype}")
        if tuple(tensor.shape) != tuple(record.shape):
            raise self.refuse(
                f"tensor {name!r} has shape {list(tensor.shape)}, the manifest says {list(record.shape)}"
            )
        loaded = private_copy(tensor)
        if self._mine is not None and name not in self._mine:
            return loaded  # another rank of this node hashes it (``share``)
        size = int(loaded.nbytes)
        if size <= INLINE_HASH_BYTES:
            self._compare(name, ckptpub.tensor_digest(small_bytes(loaded)), size)
            return loaded
        data = raw_bytes(loaded)
        self._pending.append((name, self._pool.submit(ckptpub.tensor_digest, data), size))
        self._pending_bytes += size
        self._collect(block=False)
        while self._pending_bytes > self._max_pending and self._pending:
            self._collect_one()
        return loaded

    def _collect(self, block: bool) -> None:
        while self._pending and (block or self._pending[0][1].done()):
            self._collect_one()

    def _collect_one(self) -> None:
        name, future, size = self._pending.popleft()
        self._pending_bytes -= size
        self._compare(name, future.result(), size)

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

    def mark_partial(self, reason: str) -> None:
        """vLLM reads only part of the checkpoint on purpose (e.g. expert parallelism)."""
        self.partial_reason = reason

    def finish(self) -> None:
        """Wait for the last hashes; refuse if tensors are missing; agree with the peers. Idempotent."""
        with self._told_to_peers():
            try:
                self._collect(block=True)
            finally:
                self.close()
            missing = sorted(set(self.expected) - self.seen)
            if missing and self.partial_reason is None:
                raise self.refuse(
                    f"manifest tensor {missing[0]!r} never arrived from disk", more=len(missing) - 1
                )
            unhashed = sorted(self._mine - self.seen) if self._mine is not None else []
            if unhashed:  # the peers counted on this rank for it
                raise self.refuse(
                    f"tensor {unhashed[0]!r}, this rank's to hash, never arrived", more=len(unhashed) - 1
                )
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

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def check_shards_are_files(folder: str) -> None:
    """Refuse unless every top-level ``*.safetensors`` is a regular file inside the folder.

    vLLM opens the shards with a blocking open that follows symlinks: a FIFO would
    hang the engine start, a symlink could read outside the folder. One listing (the
    entry types come with it) and a ``stat`` only for symlinks, on the disk path
    only: the daemon path touches no shard.
    """
    problems = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if not entry.name.endswith(".safetensors"):
                continue
            try:
                if entry.is_symlink():
                    mode = os.stat(resolve_inside(folder, entry.name)).st_mode
                else:
                    mode = entry.stat(follow_symlinks=False).st_mode
            except UnreadableError as error:
                problems.append(f"shard {entry.name} {error}")
                continue
            except OSError as error:
                problems.append(f"shard {entry.name} cannot be read ({error.strerror or error})")
                continue
            if not stat.S_ISREG(mode):
                problems.append(f"shard {entry.name} is not a regular file")
    if problems:
        raise RefusedError.for_problems(folder, sorted(problems))


def shard_problems(folder: str, manifest: ckptpub.Manifest) -> list[str]:
    """Weight shards that are missing, of another size, or whose header differs from the manifest.

    Run only after reading failed: it opens every shard, which a successful load never needs.
    """
    problems = []
    records = {record.path: record for record in manifest.files}
    for shard in manifest.weights:
        record = records[shard]
        try:
            header, size = read_prefix(folder, shard, record.header_size or 0)
        except UnreadableError as error:
            problems.append(f"shard {shard} {error}")
            continue
        if size != record.size:
            problems.append(f"shard {shard} has {size} bytes, the manifest says {record.size}")
        elif ckptpub.tensor_digest(header) != record.digest:
            problems.append(f"shard {shard}: its header differs from the manifest (damaged?)")
    return problems
