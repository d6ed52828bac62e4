"""Each tensor verified once per node: the ranks that load one model split the hashing by bytes.

Under tensor and pipeline parallelism every vLLM worker streams every tensor of the
checkpoint from disk (each then copies its own slice into the model). Hashing all of
them on every rank verifies each byte once per rank, where ranks that read the very
same files through one kernel (one page cache) need to hash each byte once between
them. So, before the stream, the ranks that load the model together exchange a plan
through vLLM's own groups (``Peers``: the tensor-, context- and pipeline-parallel
groups' gloo ``cpu_group``, each all-gathered in turn, so every rank of the model
takes part and no rank of another data-parallel replica does):

1. each rank's *reading*: the kernel it runs on (its boot id) and each weight shard's
   identity on storage (device, inode, size, modification and change times), as one
   fingerprint. Ranks with equal fingerprints read the same bytes (a *reading group*);
   only they share work. Ranks on another node, or that opened other files (a copy, a
   shard replaced between their opens), each verify for their own group;
2. which tensors the rank will see: all of them, or for expert parallelism the ones
   vLLM's expert filter keeps (then a bitmap over the manifest's tensors follows), or
   "unknown" (vLLM skips shards the model does not use): such a rank hashes everything
   it sees itself and takes no share of the others' work.

Every rank then computes the same assignment (``assign``): each tensor, largest first,
to the least-loaded rank of its reading group that sees it. Every rank still checks the
name, dtype and shape of every tensor it sees; it hashes its share only.

After the stream each rank checks that its shards are still the files it fingerprinted
(another rank's digest vouches for bytes this rank read only while the file is the
same), and the ranks agree on the outcome (``Peers.agree``): each rank's refusal, if
any, travels to all, so every rank refuses when any does, naming the tensor and the
rank that found it. No rank serves while another refused.

Rows are fixed-size ``uint8`` tensors (no pickle). A rank that fails outside the
verifier (vLLM's own error) never reaches the agreement; the others wait in it until
vLLM stops the engine, as they would in vLLM's own next collective.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import blake3

import ckptpub
from ckptpub.serving import RefusedError

#: Room for a rank's refusal in the agreement row (a longer one is cut).
MESSAGE_BYTES = 1024
_OK, _FAILED = 0, 1
#: What a rank will see of the checkpoint (the plan row's reads byte).
READS_ALL, READS_LISTED, READS_UNKNOWN = 0, 1, 2
_DIGEST = 32
# A plan row: status, the manifest's identity (32 bytes), the reading fingerprint (32), reads byte.
_PLAN_BYTES = 1 + 2 * _DIGEST + 1
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True)
class Peers:
    """The ranks that load one model together, as stages of a grid of process groups.

    ``groups`` are torch ``ProcessGroup`` s (gloo) whose product is the set of ranks,
    such as vLLM's tensor-parallel and pipeline-parallel ``cpu_group`` s; ``None`` is
    torch's default group. ``all_gather`` gathers over each in turn, so every rank ends
    with every rank's row, in the same order everywhere; ``index`` is this rank's place
    in that order.
    """

    groups: tuple[Any, ...]

    @property
    def size(self) -> int:
        import torch.distributed as dist

        count = 1
        for group in self.groups:
            count *= dist.get_world_size(group)
        return count

    @property
    def index(self) -> int:
        import torch.distributed as dist

        index, count = 0, 1
        for group in self.groups:
            index += dist.get_rank(group) * count
            count *= dist.get_world_size(group)
        return index

    def all_gather(self, row: bytes) -> list[bytes]:
        """Every rank's ``row`` (all of one length), this rank's at ``index``."""
        import torch
        import torch.distributed as dist

        rows = [row]
        for group in self.groups:
            mine = torch.frombuffer(bytearray(b"".join(rows)), dtype=torch.uint8)
            out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
            try:
                dist.all_gather(out, mine, group=group)
            except RuntimeError as error:  # a peer died or timed out: nothing can be agreed any more
                line = (str(error).strip().splitlines() or [type(error).__name__])[0]
                raise PeerError(f"the ranks loading this model could not exchange: {line}") from None
            block = [bytes(tensor.numpy().tobytes()) for tensor in out]
            rows = [data[i * len(row) : (i + 1) * len(row)] for data in block for i in range(len(rows))]
        return rows

    def agree(self, refusal: str | None) -> str | None:
        """The refusal of this rank or, if it has none, of the first rank that has one; None if none does."""
        row = bytearray(1 + MESSAGE_BYTES)
        if refusal is not None:
            encoded = refusal.encode("utf-8", "replace")[:MESSAGE_BYTES]
            row[0], row[1 : 1 + len(encoded)] = _FAILED, encoded
        rows = self.all_gather(bytes(row))
        if refusal is not None:
            return refusal
        for rank, other in enumerate(rows):
            if other[0] == _FAILED:
                text = other[1:].rstrip(b"\0").decode("utf-8", "replace")
                return f"rank {rank} of the {len(rows)} loading this model refused: {text}"
        return None


class PeerError(RuntimeError):
    """An exchange between the ranks failed (a rank died, or the group timed out)."""


def peers_from_vllm() -> Peers | None:
    """vLLM's groups of the ranks that load this model (tensor, context and pipeline parallel), or
    None when one rank loads it alone (or vLLM's model-parallel state is not set up)."""
    try:
        from vllm.distributed import parallel_state
    except ImportError:
        return None
    if not parallel_state.model_parallel_is_initialized():
        return None
    stages = [parallel_state.get_tp_group(), parallel_state.get_pp_group()]
    if hasattr(parallel_state, "get_pcp_group"):  # 0.32: prefill context parallel, its own grid axis
        stages.insert(1, parallel_state.get_pcp_group())
    groups = tuple(stage.cpu_group for stage in stages if stage.world_size > 1)
    return Peers(groups) if groups else None


def reading_fingerprint(folder: str, shards: Iterable[str]) -> bytes:
    """BLAKE3 of the kernel this process runs on and each shard's identity on storage.

    Equal on two ranks exactly when they run on one kernel (so one page cache) and
    opened the same files, unchanged; a shard that cannot be stat-ed makes the
    fingerprint this rank's alone.
    """
    hasher = blake3.blake3()
    try:
        with open(BOOT_ID_PATH, "rb") as boot:
            hasher.update(boot.read(64))
    except OSError:  # not Linux: no proof two ranks share a page cache, so none share work
        hasher.update(os.urandom(_DIGEST))
    for shard in sorted(shards):
        hasher.update(f"{shard}\0{_storage_identity(os.path.join(folder, shard))}\n".encode(errors="replace"))
    return hasher.digest()


def _storage_identity(path: str) -> str:
    try:
        info = os.stat(path)
    except OSError:
        return f"unreadable {os.urandom(8).hex()}"
    return f"{info.st_dev} {info.st_ino} {info.st_size} {info.st_mtime_ns} {info.st_ctime_ns}"


@dataclass(frozen=True)
class Share:
    """What the plan leaves to this rank: the tensors it hashes, of how many, with how many peers."""

    mine: frozenset[str] | None  # None: every tensor this rank sees
    total: int  # the manifest's tensors
    helpers: int  # ranks of this rank's reading group (1: it verifies alone)


def plan(
    peers: Peers,
    manifest: ckptpub.Manifest,
    sizes: dict[str, int],
    fingerprint: bytes,
    sees: Callable[[str], bool] | None,
    reads: int,
) -> Share:
    """Exchange the plan rows and compute this rank's share (see the module docstring).

    ``sizes`` maps each manifest tensor to its byte count; ``sees`` says, for
    ``READS_LISTED``, whether this rank will see a tensor. Raises ``RefusedError`` on
    every rank alike when the ranks hold different manifests.
    """
    row = bytearray(_PLAN_BYTES)
    row[1 : 1 + _DIGEST] = bytes.fromhex(manifest.identity.removeprefix("blake3:"))
    row[1 + _DIGEST : 1 + 2 * _DIGEST] = fingerprint
    row[-1] = reads
    rows = peers.all_gather(bytes(row))
    if len({other[1 : 1 + _DIGEST] for other in rows}) > 1:
        raise RefusedError(
            "(several ranks)",
            "the ranks loading this model read different manifests (the checkpoint changed "
            "while the engine started?)",
        )
    names = sorted(sizes)
    listed = None
    if any(other[-1] == READS_LISTED for other in rows):
        bitmap = bytearray((len(names) + 7) // 8)
        if reads == READS_LISTED and sees is not None:
            for position, name in enumerate(names):
                if sees(name):
                    bitmap[position // 8] |= 1 << (position % 8)
        listed = peers.all_gather(bytes(bitmap))
    me = peers.index
    group = [
        rank
        for rank, other in enumerate(rows)
        if other[1 + _DIGEST : 1 + 2 * _DIGEST] == fingerprint and other[-1] != READS_UNKNOWN
    ]
    if reads == READS_UNKNOWN or len(group) < 2:
        return Share(None, len(names), 1)

    def seen_by(rank: int, position: int) -> bool:
        if rows[rank][-1] == READS_ALL:
            return True
        assert listed is not None
        return bool(listed[rank][position // 8] >> (position % 8) & 1)

    owners = assign(names, sizes, group, seen_by)
    mine = frozenset(name for name, owner in zip(names, owners, strict=True) if owner == me)
    return Share(mine, len(names), len(group))


def assign(
    names: Sequence[str], sizes: dict[str, int], ranks: Sequence[int], seen_by: Callable[[int, int], bool]
) -> list[int | None]:
    """The rank that hashes each of ``names``: largest first to the least-loaded rank that sees it
    (the lowest on ties), None when no rank sees it. Every rank computes the same list."""
    owners: list[int | None] = [None] * len(names)
    loads = dict.fromkeys(ranks, 0)
    for position in sorted(range(len(names)), key=lambda p: (-sizes[names[p]], p)):
        readers = [rank for rank in ranks if seen_by(rank, position)]
        if readers:
            owner = min(readers, key=lambda rank: (loads[rank], rank))
            owners[position] = owner
            loads[owner] += sizes[names[position]]
    return owners
