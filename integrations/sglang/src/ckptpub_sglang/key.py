"""SGLang's weight-cache key with the manifest's identity in place of the model path.

SGLang's key is ``CacheConfig`` (``sglang.srt.weight_cache.protocol``): parallel sizes,
quantization, dtype, an environment stamp and, for the checkpoint, the model path as
given and the revision; ``matches`` is plain equality. A daemon that loaded
``latest -> step-1000`` therefore serves an engine started after ``latest`` moved, a
step re-saved in place is served its old weights, and the same folder by another path
misses. Both sides build the key by calling ``CacheConfig(...)`` by its module-level
name (the engine in ``IpcModelLoader._fetch_from_cache``, the daemon in
``WeightCacheDaemon.load``), so the plugin replaces that class through SGLang's hook
registry with :func:`config_class`'s subclass:

* its ``model_path`` and ``revision`` become the manifest's identity and ``""`` (read
  from ``ckptpub.json`` alone, under the decision in force: ``decision.checked``), so
  copies and aliases of one published folder hit, and a re-save, a moved link, another
  step or a moved hub branch miss;
* a folder without a manifest gets a key that matches nothing (``NO_MANIFEST`` and a
  random nonce): never served from, nor to, a daemon;
* one more field, ``ckptpub_identity``: the key travels as a dict and ``from_dict`` is
  ``cls(**d)``, so an unpatched daemon refuses a patched engine's key (an unexpected
  field), and the subclass's ``from_dict`` refuses a key without it: a daemon and an
  engine of which only one has the plugin fail closed, never compare paths.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from .decision import decide

#: The field the subclass adds.
FIELD = "ckptpub_identity"
#: The start of a key that matches no other: a folder without a manifest.
NO_MANIFEST = "ckptpub:no-manifest:"
#: Where SGLang defines its key; the hook registry also replaces every ``from ... import`` of it.
TARGET = "sglang.srt.weight_cache.protocol.CacheConfig"


def checkpoint_key(model_path: str, revision: str) -> str:
    """The checkpoint part of the key: the manifest's identity, or a key no other process will build."""
    found = decide(model_path, revision or None)
    if found.manifest is None:
        return NO_MANIFEST + uuid.uuid4().hex
    return found.manifest.identity


@functools.cache
def config_class() -> type:
    """SGLang's ``CacheConfig`` with the identity in place of the path, and one more field."""
    from sglang.srt.weight_cache.protocol import CacheConfig

    class IdentityCacheConfig(CacheConfig):  # type: ignore[misc]  # a msgspec.Struct of SGLang's
        """SGLang's key, checkpoint by identity (``ckptpub_sglang.key``)."""

        ckptpub_identity: str = ""

        def __post_init__(self) -> None:
            # SGLang builds its key without the field; a key decoded by ``from_dict`` carries it.
            if not self.ckptpub_identity:
                fields: Any = self  # SGLang's fields, untyped here
                self.ckptpub_identity = checkpoint_key(fields.model_path, fields.revision)
                self.model_path = self.ckptpub_identity
                self.revision = ""

        @classmethod
        def from_dict(cls, fields: dict[str, Any]) -> Any:
            if FIELD not in fields:
                raise TypeError(
                    "ckptpub: the other side's weight-cache key has no ckptpub_identity: its ckptpub-sglang "
                    "plugin is not loaded, so the two cannot agree on a checkpoint"
                )
            return cls(**fields)

    return IdentityCacheConfig
