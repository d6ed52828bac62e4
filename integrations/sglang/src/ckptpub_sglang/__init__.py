"""ckptpub's SGLang plugin: weight-cache keys from manifests, verified disk loading.

SGLang loads every ``sglang.srt.plugins`` entry point (``load_plugins``) in its engine,
scheduler, detokenizer and data-parallel controller and calls it; :func:`register` is
that entry point. It registers hooks in SGLang's hook registry, which SGLang applies
right after (``HookRegistry.apply_hooks``: a replaced class or function is replaced in
every module that imported it too). Importing the package imports neither SGLang nor
torch; registering does, in SGLang's processes.

Modules, lowest first (each imports only the ones before it; ``tests/core/test_layers.py``):

* :mod:`.log`, :mod:`.decision` (no SGLang, no torch): which manifest speaks for a model,
  decided once per load under the environment's policy;
* :mod:`.key`: SGLang's ``CacheConfig`` with the manifest's identity in place of the path,
  and one more field, so a daemon and an engine of which only one has the plugin fail closed;
* :mod:`.loader`: SGLang's disk loader's weight stream verified tensor by tensor;
* :mod:`.engine`: the engine's load through the weight cache under one decision;
* :mod:`.daemon`: the daemons get the plugin however they start (``python -m
  ckptpub_sglang.daemon``, and the daemons an engine spawns).
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["SUPPORTED_SGLANG", "__version__", "register"]

#: The SGLang release whose weight-cache code this plugin was written against (its key changes between
#: releases; ``integrations/sglang/compat/check_sglang_api.py`` checks every name the plugin touches).
SUPPORTED_SGLANG = "0.5.23"
_registered = False


def register() -> None:
    """Entry point of the ``sglang.srt.plugins`` group (safe to call many times: it registers once)."""
    global _registered
    if _registered:
        return
    _registered = True
    import sglang
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from . import daemon, engine, key, loader
    from .log import logger

    if sglang.__version__ != SUPPORTED_SGLANG:
        logger.warning(
            "ckptpub: SGLang %s is not the supported version %s; the weight-cache key may not apply",
            sglang.__version__,
            SUPPORTED_SGLANG,
        )
    HookRegistry.register(key.TARGET, key.config_class(), HookType.REPLACE)
    HookRegistry.register(loader.TARGET, loader.verified_weights, HookType.AROUND)
    HookRegistry.register(engine.LOAD_TARGET, engine.load_model, HookType.AROUND)
    HookRegistry.register(engine.FETCH_TARGET, engine.fetch_from_cache, HookType.AROUND)
    HookRegistry.register(daemon.LOAD_TARGET, daemon.load, HookType.AROUND)
    HookRegistry.register(daemon.SPAWN_TARGET, daemon.spawn, HookType.REPLACE)
