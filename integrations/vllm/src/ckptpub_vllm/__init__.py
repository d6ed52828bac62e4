"""ckptpub's vLLM plugin: weight-cache keys from manifests, verified disk loading.

vLLM loads every ``vllm.general_plugins`` entry point once per process (CLI, API
server, engine core, workers) and calls it; :func:`register` is that entry point.
It must therefore be idempotent and cheap, and must never fail a process that does
not use ckptpub: it patches a few attributes and registers one loader name, and each
patch does nothing unless an engine loads through that name.

What it installs (each step is idempotent):

* ``key.install``: the ``checkpoint`` field of vLLM's ``WeightCacheKey`` becomes the
  manifest's identity for folders with a ``ckptpub.json`` (read from that file only).
* ``loader.install``: ``--load-format manifest_cache`` (:class:`ManifestCacheLoader`).
* ``daemon.install``: ``vllm preload`` spawns its daemons through a wrapper defined
  here, because daemon children never load plugins themselves.
* ``frontend.install``: in the process that starts an engine, ``manifest_cache``'s
  options and start checks run at config time, and refusals of its engine processes
  are raised there in their own words.
* ``adapter_gate.install`` and ``adapter_frontend.install``: LoRA adapters, checked
  in the workers (``adapters``, installed by the loader once it served a base), are
  admitted by the engine core only once loaded, and a refusal reaches the caller as
  an error of that request. Inert for engines with any other load format.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["register", "LOAD_FORMAT", "__version__"]

LOAD_FORMAT = "manifest_cache"
#: vLLM minor versions whose weight-cache code this plugin was written against.
SUPPORTED_VLLM = ("0.32.", "0.33.")
_warned = False


def register() -> None:
    """Entry point of the ``vllm.general_plugins`` group (safe to call many times)."""
    global _warned
    import vllm

    from . import adapter_frontend, adapter_gate, daemon, frontend, key, loader
    from .log import logger

    if not _warned and not vllm.__version__.startswith(SUPPORTED_VLLM):
        _warned = True
        logger.warning(
            "ckptpub: vLLM %s is not a supported version (%s); the weight-cache key patch may not apply",
            vllm.__version__,
            ", ".join(v + "x" for v in SUPPORTED_VLLM),
        )
    key.install()
    loader.install()
    daemon.install()
    frontend.install()
    adapter_gate.install()
    adapter_frontend.install()
