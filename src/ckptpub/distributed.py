"""Hash a checkpoint on every rank of a ``torch.distributed`` job; one rank writes the manifest.

``publish``, ``build_manifest`` and ``verify`` take a ``DistributedHasher`` as ``hasher=``;
``publish_on_ranks`` publishes on rank 0 and builds the same manifest on the others.
Make the hasher with ``init_from_env`` (the job ``torchrun`` started) or from a gloo
group of its own (``DistributedHasher(new_group())``, what the Trainer callback does).
torch is imported only when a hasher is made. The implementation is
``ckptpub._hashing.distributed`` (``docs/callback.md`` has how work and failures travel).
"""

from ._hashing.distributed import DEFAULT_TIMEOUT_S, DistributedHasher, env_world, init_from_env, new_group
from ._operations.publishing import publish_on_ranks

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DistributedHasher",
    "env_world",
    "init_from_env",
    "new_group",
    "publish_on_ranks",
]
