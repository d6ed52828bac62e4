"""Hash a checkpoint on every rank of a ``torch.distributed`` job; one rank writes the manifest.

Why: a multi-node job's checkpoint sits on shared storage that each node reads at its
own link's bandwidth, so hashing it on one rank leaves every other link idle.
``DistributedHasher`` is a ``SpanHasher`` (``options``; ``publish``, ``verify`` and
``build_manifest`` take it as ``hasher=``): every rank calls it with the same spans
(each rank scans the same folder), each hashes the files it owns (whole files, balanced
by bytes), and the digests travel through the group's own collectives, so every rank
returns every digest and the writing rank builds exactly the manifest one process would.

Each call is two exchanges of fixed-size rows (``ranks.Exchange`` over the group's
gloo ``all_gather`` of ``uint8`` tensors, no pickle), each row with a status and room
for an error message, so a rank that failed makes every rank fail with its reason:

1. the plan: each rank's span count and a BLAKE3 fingerprint of its span names and
   ranges, and its files' ``ranks.storage_fingerprint`` (the same files on storage,
   wherever each rank runs); or the error that stopped it before hashing
   (``taking_part``). Ranks that see different folders refuse together.
2. the digests: 32 bytes per span, filled on the rows the rank owns (and, when a rank
   signs, 32 per file owned: its SHA-256 or BLAKE3). Files go to ranks whole, by
   ``ranks.assign``.

A rank trusts another's digest of a file it did not read only when the two see the
very same file on storage (one shared file system, wherever each mounts it): equal
names, sizes and headers do not make equal bytes (node-local copies, a stale
replica). When any rank's files are other files than the rest's, every rank hashes
every file itself, and the ranks compare their digests: equal, the result is the
single-process one (no faster); different, every rank refuses, naming the first
span whose bytes differ, so no rank's verdict or manifest rests on bytes it did not read.

A rank that dies or stalls makes the others' collective fail after the group's
timeout (gloo raises; a dead peer's closed connection is usually seen at once). The
hasher is then broken: it never uses the group again (a late rank's messages could
be taken for the next call's) and refuses later calls at once, so each rank goes on
without it. torch is imported only here, and only when a hasher is made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import blake3

from .._filesystem.objects import is_object_url
from .._format.digest import DIGEST_PREFIX
from .._settings import seconds
from ..errors import CkptpubError
from .engine import FILE_HASHES, FileDigests, Span, check_file_hash
from .options import HashOptions
from .ranks import Exchange, ExchangeError, assign, storage_fingerprint

log = logging.getLogger("ckptpub")

#: Seconds a rank waits for the others at each exchange; the digest exchange waits for the slowest
#: rank's hashing, so this must cover hashing one rank's share of the checkpoint.
DEFAULT_TIMEOUT_S = 600.0
DIGEST_BYTES = 32
# A plan payload: span count (8 bytes), fingerprint, storage fingerprint, whole-file hash wanted (0 none,
# else 1 + its index in FILE_HASHES).
_PLAN_SAME = slice(0, 8 + DIGEST_BYTES)  # span count and fingerprint: equal on every rank
_PLAN_STORAGE = slice(8 + DIGEST_BYTES, 8 + 2 * DIGEST_BYTES)  # equal where ranks read the same files
_PLAN_FILE_HASH = 8 + 2 * DIGEST_BYTES
_PLAN_BYTES = _PLAN_FILE_HASH + 1
# A digest payload: DIGEST_BYTES per span, then (when wanted) a whole-file digest per file (SHA-256 and
# BLAKE3 are both DIGEST_BYTES long).


def new_group(timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
    """A gloo group of every rank of the default group, with its own timeout.

    Collective: every rank must call it at the same point (a training job's start).
    gloo works on CPU tensors whatever the training backend (NCCL included).
    """
    from datetime import timedelta

    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=timedelta(seconds=seconds(timeout_s, "timeout_s")))


def env_world() -> tuple[int, int] | None:
    """``(rank, world_size)`` from torchrun's environment when it starts several processes, else None."""
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return (rank, world) if world > 1 and 0 <= rank < world else None


def init_from_env(timeout_s: float = DEFAULT_TIMEOUT_S) -> DistributedHasher:
    """Join the job torchrun started (``env://``: ``MASTER_ADDR``, ``RANK``...) with gloo; its hasher."""
    from datetime import timedelta

    import torch.distributed as dist

    if not dist.is_initialized():
        timeout = timedelta(seconds=seconds(timeout_s, "timeout_s"))
        try:
            dist.init_process_group(backend="gloo", timeout=timeout)
        except (RuntimeError, ValueError) as error:
            raise CkptpubError(f"cannot join the torchrun job: {error}") from None
    return DistributedHasher(None)


def assign_files(spans: Sequence[Span], ranks: int) -> list[int]:
    """The rank that hashes each span: whole files (runs of spans with one path), balanced by bytes.

    ``ranks.assign``: largest file first to the least-loaded rank (lowest rank on ties),
    so every rank computes the same assignment from the same spans.
    """
    files = files_of(spans)
    owners = [0] * len(spans)
    sizes = [sum(s.size for s in spans[first:end]) for first, end in files]
    for (first, end), rank in zip(files, assign(sizes, range(ranks)), strict=True):
        owners[first:end] = [rank or 0] * (end - first)  # every rank may take any file: never None
    return owners


def files_of(spans: Sequence[Span]) -> list[tuple[int, int]]:
    """``(first, end)`` span indexes of each file: the runs of consecutive spans with one path."""
    files, first = [], 0
    for index in range(1, len(spans) + 1):
        if index == len(spans) or spans[index].path != spans[first].path:
            files.append((first, index))
            first = index
    return files


def plan_fingerprint(spans: Sequence[Span]) -> bytes:
    """BLAKE3 of the span names and ranges: equal on ranks that see the same folder (paths may differ).

    An object's span adds the ETag its rank's listing saw: ranks that listed different
    versions of an ``s3://`` prefix (or reached different stores under one URL) see
    different checkpoints, and are refused as such.
    """
    hasher = blake3.blake3()
    for span in spans:
        listed = f"\0{span.expect[0]}" if span.expect is not None and is_object_url(span.path) else ""
        hasher.update(f"{span.label}\0{span.start}\0{span.end}{listed}\n".encode("utf-8", "surrogateescape"))
    return hasher.digest()


class DistributedHasher:
    """``engine.hash_spans`` (and ``hash_files``) spread over the ranks of a process group (``None``: the
    default group).

    Every rank of the group must call it, with the same spans, the same number of
    times. ``broken`` says why it stopped being usable (None while usable).
    """

    def __init__(self, group: Any) -> None:
        import torch.distributed as dist

        self._group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.broken: str | None = None
        self._joined = False
        self._exchange = Exchange(self._all_gather, self.rank, self.world_size)

    def span_digests(self, spans: Sequence[Span], options: HashOptions) -> list[str]:
        """Every span's digest in order, as ``hash_spans`` returns them."""
        return self._hash(spans, options, None).spans

    def file_digests(self, spans: Sequence[Span], algorithm: str, options: HashOptions) -> FileDigests:
        """Every span's digest and every file's ``algorithm`` digest, as ``hash_files`` returns them.

        When any rank asks for whole-file digests (the writer, when it signs), every rank
        computes them for the files it owns, so the rows keep one size.
        """
        return self._hash(spans, options, check_file_hash(algorithm))

    def _hash(self, spans: Sequence[Span], options: HashOptions, algorithm: str | None) -> FileDigests:
        """One distributed call: plan, hash this rank's files, exchange (file digests empty unless asked)."""
        self._joined = True
        plan = bytearray(_PLAN_BYTES)
        plan[_PLAN_SAME] = len(spans).to_bytes(8, "little") + plan_fingerprint(spans)
        paths = [spans[first].path for first, _ in files_of(spans)]
        plan[_PLAN_STORAGE] = storage_fingerprint(paths, one_page_cache=False)
        plan[_PLAN_FILE_HASH] = 0 if algorithm is None else 1 + FILE_HASHES.index(algorithm)
        plans = self._exchange.rows(bytes(plan))
        if any(other[_PLAN_SAME] != plan[_PLAN_SAME] for other in plans):
            raise CkptpubError(
                "the ranks see different checkpoints (file lists or layouts differ); "
                "publish once every rank sees the complete folder"
            )
        asked = {other[_PLAN_FILE_HASH] for other in plans} - {0}
        if len(asked) > 1:
            raise CkptpubError("the ranks ask for different whole-file hashes (sign_hash differs)")
        wanted = FILE_HASHES[asked.pop() - 1] if asked else None
        shared = all(other[_PLAN_STORAGE] == plans[0][_PLAN_STORAGE] for other in plans)
        if not shared:
            log.warning(
                "ckptpub: the ranks read the folder from different storage (copies, not one shared "
                "file system): every rank hashes every file itself, and the ranks compare digests"
            )
        owners = assign_files(spans, self.world_size) if shared else [self.rank] * len(spans)
        mine = [i for i, owner in enumerate(owners) if owner == self.rank]
        files = [first for first, _ in files_of(spans)]  # each file's first span
        files_at = DIGEST_BYTES * len(spans)
        rows = bytearray(files_at + (DIGEST_BYTES * len(files) if wanted else 0))
        my_spans = [spans[i] for i in mine]
        local = dataclasses.replace(options, hasher=None)  # this rank's share, on its own threads
        problem = None
        try:
            if wanted:
                digests, my_files = local.file_digests(my_spans, wanted)
            else:
                digests, my_files = local.span_digests(my_spans), []
        except CkptpubError as error:
            problem = str(error)
        else:
            places = [DIGEST_BYTES * i for i in mine]
            values = [digest.removeprefix(DIGEST_PREFIX) for digest in digests]
            if wanted:
                places += [
                    files_at + DIGEST_BYTES * f for f, first in enumerate(files) if owners[first] == self.rank
                ]
                values += my_files
            for at, value in zip(places, values, strict=True):
                rows[at : at + DIGEST_BYTES] = bytes.fromhex(value)
        gathered = self._exchange.rows(bytes(rows), problem)
        if not shared:
            _raise_differences(gathered, spans, files_at)
        file_digests = (
            [
                gathered[owners[first]][at : at + DIGEST_BYTES].hex()
                for at, first in zip(range(files_at, len(rows), DIGEST_BYTES), files, strict=True)
            ]
            if algorithm
            else []
        )
        span_digests = [
            DIGEST_PREFIX + gathered[owner][at : at + DIGEST_BYTES].hex()
            for at, owner in zip(range(0, files_at, DIGEST_BYTES), owners, strict=True)
        ]
        return FileDigests(span_digests, file_digests)

    def close(self) -> None:
        """Leave the hasher's own group on every rank together: a barrier, then the group destroyed.

        For a group made for hashing (``new_group``), at a point every rank reaches after
        its last call (a training's end). The barrier means no rank is inside a collective
        of the group any more when any rank takes it down; left to the interpreter's exit,
        its teardown on a rank whose peer already exited aborts the process (SIGABRT,
        "terminate called without an active exception"). The default group (``None``) is
        its creator's to end. A failed barrier leaves the group as it is, broken.
        """
        if self._group is None or not self.meet():
            return
        import torch.distributed as dist

        dist.destroy_process_group(self._group)
        self.broken = "its group was closed"

    def meet(self) -> bool:
        """A barrier of every rank of the group; False (and the hasher broken) when it fails or is broken."""
        if self.broken is not None:
            return False
        import torch.distributed as dist

        try:
            dist.barrier(group=self._group)
        except RuntimeError as error:
            self.broken = _first_line(error)
            return False
        return True

    @contextlib.contextmanager
    def taking_part(self) -> Iterator[None]:
        """Run a ``publish``/``verify`` with this hasher; an error before it hashed is told to the others.

        Without this, a rank that fails before it reaches the hasher (an unreadable
        manifest, a folder it cannot see) would leave the others waiting for the timeout.
        """
        self._joined = False
        try:
            yield
        except Exception as error:
            if not self._joined and self.broken is None:
                self._joined = True  # once per call, even when an enclosing block sees the error too
                with contextlib.suppress(CkptpubError):
                    self._exchange.rows(bytes(_PLAN_BYTES), str(error))
            raise

    def _all_gather(self, row: bytes) -> list[bytes]:
        """The group's gloo ``all_gather`` of one row per rank (``ranks.Exchange``'s transport)."""
        if self.broken is not None:
            raise ExchangeError(f"distributed hashing is off after an earlier failure: {self.broken}")
        import torch
        import torch.distributed as dist

        mine = torch.frombuffer(bytearray(row), dtype=torch.uint8)  # never empty: every row has a status
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        try:
            dist.all_gather(out, mine, group=self._group)
        except RuntimeError as error:  # a timeout, a peer gone: the group's state is unknown from here on
            self.broken = _first_line(error)
            raise ExchangeError(
                f"distributed hashing failed (a rank died or timed out): {self.broken}"
            ) from None
        return [bytes(tensor.numpy().tobytes()) for tensor in out]


def _raise_differences(rows: list[bytes], spans: Sequence[Span], files_at: int) -> None:
    """Refuse, on every rank alike, when ranks that each hashed every span read different bytes."""
    for rank, row in enumerate(rows):
        if row == rows[0]:
            continue
        at = next(i for i in range(len(row)) if row[i] != rows[0][i])
        if at < files_at:
            where = spans[at // DIGEST_BYTES].label
        else:  # a whole file's digest (for a signature)
            where = spans[files_of(spans)[(at - files_at) // DIGEST_BYTES][0]].name
        raise CkptpubError(
            f"rank {rank} read other bytes than rank 0 in {where}: the ranks' copies of the folder "
            "differ; publish or verify where every rank reads the same files"
        )


def _first_line(error: BaseException) -> str:
    """The first line of a gloo error, without its ``[source.cc:123]`` prefix."""
    line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return line.split("] ", 1)[1] if line.startswith("[") and "] " in line else line
