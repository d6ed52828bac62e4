"""ckptpub's vLLM plugin: weight-cache keys from manifests, verified disk loading.

vLLM loads every ``vllm.general_plugins`` entry point once per process (CLI, API
server, engine core, workers) and calls it; :func:`register` is that entry point.
It must therefore be idempotent and cheap, and must never fail a process that does
not use ckptpub: it patches a few attributes and registers one loader name, and each
patch does nothing unless an engine loads through that name.

The plugin is layered by the process its code runs in, lowest first; each subpackage
imports only the ones before it (``tests/core/test_layers.py`` checks it):

* :mod:`.shared` (every process): the logger, the options, refusals and their relay,
  the weight-cache key, the start checks, the daemons' reports;
* :mod:`.worker` (engine workers, and the daemon's load): the ``manifest_cache``
  loader, the streamed tensor checks, LoRA adapters' checked reads;
* :mod:`.engine_core`: admission of requests whose adapter the workers may refuse;
* :mod:`.frontend` (the process that starts an engine): config-time checks, refusals
  raised in their own words, what is served;
* :mod:`.daemon` (``vllm preload``'s CLI and its weight-cache daemon children);
* :mod:`.preload` (``ckptpub preload``, the supervisor): imports ``shared`` only, never vLLM.

What :func:`register` installs (each step is idempotent):

* ``shared.key.install``: the ``checkpoint`` field of vLLM's ``WeightCacheKey`` becomes
  the manifest's identity for folders with a ``ckptpub.json`` (read from that file only).
* ``worker.loader.install``: ``--load-format manifest_cache`` (``ManifestCacheLoader``).
* ``engine_core.adapter_gate.install``: LoRA adapters, checked in the workers
  (``worker.adapters``, installed by the loader once it served a base), are admitted
  by the engine core only once loaded. Inert for engines with any other load format.
* ``frontend.install``: in the process that starts an engine, ``manifest_cache``'s
  options and start checks run at config time, refusals of its engine processes are
  raised there in their own words, and a refused adapter reaches the caller as an
  error of that request.
* ``daemon.install``: ``vllm preload`` spawns its daemons through a wrapper defined
  there, because daemon children never load plugins themselves.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["register", "__version__"]

#: vLLM minor versions whose weight-cache code this plugin was written against.
SUPPORTED_VLLM = ("0.32.", "0.33.")
_warned = False


def register() -> None:
    """Entry point of the ``vllm.general_plugins`` group (safe to call many times)."""
    global _warned
    # Imported here, not at the top: importing the package (as ``ckptpub preload`` does, for
    # its subpackage) must not import vLLM or torch; registering does, in vLLM's processes.
    import vllm

    from . import daemon, frontend
    from .engine_core import adapter_gate
    from .shared import key
    from .shared.log import logger
    from .worker import loader

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
