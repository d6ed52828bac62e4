"""Hash a checkpoint on every rank of a job; one rank writes the manifest. Which rank hashes what.

``publish``, ``build_manifest`` and ``verify`` take a ``DistributedHasher`` as ``hasher=``;
``publish_on_ranks`` publishes on rank 0 and builds the same manifest on the others.
Make the hasher with ``init_from_env`` (the job ``torchrun`` started) or from a gloo
group of its own (``DistributedHasher(new_group())``, what the Trainer callback does).
torch is imported only when a hasher is made. The implementation is
``ckptpub._hashing.distributed`` (``docs/callback.md`` has how work and failures travel).

The rules any multi-rank user shares, engine-neutral (no torch, no engine: an integration
hands its ranks' ``all_gather`` of byte rows in), implemented once in ``ckptpub._hashing.ranks``
and used by the hasher above and by the vLLM plugin's ranks:

- ``Exchange(all_gather, rank, size)``: rows of one agreed length, each with room for a
  problem (``MESSAGE_BYTES``); ``rows`` and ``agree`` raise ``RankRefusedError`` (the lowest
  rank with a problem, and the problem) on every rank when any rank sent one, and
  ``ExchangeError`` when the exchange itself failed. ``AllGather`` is the function's type.
- ``assign(sizes, ranks, eligible)``: each item, largest first, to the least-loaded rank
  that may take it; every rank computes the same owners.
- ``storage_fingerprint(paths, one_page_cache=...)``: the same-file rule: equal on ranks
  that read the same files on storage (``False``: publish, verify, across nodes of one
  NFS export) or the very same bytes through one kernel's page cache (``True``: an
  engine's ranks).
- ``split_hashing(exchange, identity, sizes, fingerprint, reads, sees) -> Share``: the plan
  by which an engine's ranks split the hashing of the tensors they load (``READS_ALL``,
  ``READS_LISTED``, ``READS_UNKNOWN``: what a rank will see).
"""

from ._hashing.distributed import DEFAULT_TIMEOUT_S, DistributedHasher, env_world, init_from_env, new_group
from ._hashing.ranks import (
    MESSAGE_BYTES,
    READS_ALL,
    READS_LISTED,
    READS_UNKNOWN,
    AllGather,
    Exchange,
    ExchangeError,
    RankRefusedError,
    Share,
    assign,
    split_hashing,
    storage_fingerprint,
)
from ._operations.publishing import publish_on_ranks

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MESSAGE_BYTES",
    "READS_ALL",
    "READS_LISTED",
    "READS_UNKNOWN",
    "AllGather",
    "DistributedHasher",
    "Exchange",
    "ExchangeError",
    "RankRefusedError",
    "Share",
    "assign",
    "env_world",
    "init_from_env",
    "new_group",
    "publish_on_ranks",
    "split_hashing",
    "storage_fingerprint",
]
