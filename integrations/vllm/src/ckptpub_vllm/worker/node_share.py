"""Each tensor verified once per node: the ranks that load one model split the hashing by bytes.

Under tensor and pipeline parallelism every vLLM worker streams every tensor of the
checkpoint from disk (each then copies its own slice into the model). Hashing all of
them on every rank verifies each byte once per rank, where ranks that read the very
same files through one kernel (one page cache) need to hash each byte once between
them. So, before the stream, the ranks that load the model together exchange a plan
through vLLM's own groups (``Peers``: the tensor-, context- and pipeline-parallel
groups' gloo ``cpu_group``, each all-gathered in turn, so every rank of the model
takes part and no rank of another data-parallel replica does):

1. each rank's *reading*: the core's ``storage_fingerprint`` of the weight shards with
   ``one_page_cache=True`` (the kernel's boot id, each shard's device, inode, size,
   modification and change times). Ranks with equal fingerprints read the same bytes
   through one page cache (a *reading group*); only they share work. Ranks on another
   node, or that opened other files (a copy, a shard replaced between their opens),
   each verify for their own group;
2. which tensors the rank will see: all of them, or for expert parallelism the ones
   vLLM's expert filter keeps (then a bitmap over the manifest's tensors follows), or
   "unknown" (vLLM skips shards the model does not use): such a rank hashes everything
   it sees itself and takes no share of the others' work.

Every rank then computes the same assignment (the core's ``assign``): each tensor,
largest first, to the least-loaded rank of its reading group that sees it. Every rank
still checks the name, dtype and shape of every tensor it sees; it hashes its share only.

After the stream each rank checks that its shards are still the files it fingerprinted
(another rank's digest vouches for bytes this rank read only while the file is the
same), and the ranks agree on the outcome (``Peers.agree``): each rank's refusal, if
any, travels to all, so every rank refuses when any does, naming the tensor and the
rank that found it. No rank serves while another refused.

The plan, the assignment and the agreement are the core's (``ckptpub.distributed``:
``split_hashing``, ``Exchange``), the ones distributed publish and verify use; this
module only turns vLLM's groups into the ``all_gather`` of fixed-size byte rows
(``uint8`` tensors, no pickle) they run over. A rank that fails outside the verifier
(vLLM's own error) never reaches the agreement; the others wait in it until vLLM stops
the engine, as they would in vLLM's own next collective.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import ckptpub
from ckptpub.distributed import (
    READS_ALL,
    READS_LISTED,
    READS_UNKNOWN,
    Exchange,
    ExchangeError,
    RankRefusedError,
    Share,
    split_hashing,
    storage_fingerprint,
)
from ckptpub.serving import RefusedError

__all__ = [
    "READS_ALL",
    "READS_LISTED",
    "READS_UNKNOWN",
    "Peers",
    "Share",
    "peers_from_vllm",
    "plan",
    "reading_fingerprint",
]


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

    @property
    def exchange(self) -> Exchange:
        """The core's exchange of rows over these ranks."""
        return Exchange(self.all_gather, self.index, self.size)

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
                raise ExchangeError(f"the ranks loading this model could not exchange: {line}") from None
            block = [bytes(tensor.numpy().tobytes()) for tensor in out]
            rows = [data[i * len(row) : (i + 1) * len(row)] for data in block for i in range(len(rows))]
        return rows

    def agree(self, refusal: str | None) -> str | None:
        """The refusal of this rank or, if it has none, of the first rank that has one; None if none does."""
        try:
            self.exchange.agree(refusal)
        except RankRefusedError as refused:
            if refusal is not None:
                return refusal
            return f"rank {refused.rank} of the {self.size} loading this model refused: {refused.problem}"
        return None


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
    """The shards' ``storage_fingerprint`` as this rank reads them: equal on two ranks exactly when they
    run on one kernel (so one page cache) and opened the same files, unchanged."""
    return storage_fingerprint((os.path.join(folder, shard) for shard in sorted(shards)), one_page_cache=True)


def plan(
    peers: Peers,
    manifest: ckptpub.Manifest,
    sizes: dict[str, int],
    fingerprint: bytes,
    sees: Callable[[str], bool] | None,
    reads: int,
) -> Share:
    """The core's ``split_hashing`` over the peers (see the module docstring).

    ``sizes`` maps each manifest tensor to its byte count; ``sees`` says, for
    ``READS_LISTED``, whether this rank will see a tensor. Raises ``RefusedError`` on
    every rank alike when the ranks hold different manifests.
    """
    try:
        return split_hashing(peers.exchange, manifest.identity, sizes, fingerprint, reads, sees)
    except ExchangeError:
        raise
    except ckptpub.CkptpubError as error:
        raise RefusedError("(several ranks)", str(error)) from None
