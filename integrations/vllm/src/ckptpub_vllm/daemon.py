"""Carry the plugin into ``vllm preload``'s weight-cache daemons.

``vllm preload`` starts one daemon per GPU with the ``spawn`` start method and
``target=daemon._run_daemon``; the children never call ``load_general_plugins``, so
a patch made by a plugin in the launcher does not reach the process that computes
the daemon's key. ``preload`` imports ``_run_daemon`` from the daemon module when
it runs (after plugins are loaded), so :func:`install` replaces that attribute with
:func:`run_daemon`. Spawn pickles a function by reference, so the child imports this
module to find it, and :func:`run_daemon` installs the plugin there before handing
over to vLLM's own ``_run_daemon``.

In the daemon the weights are keyed by the manifest identity, so they must be
exactly those bytes: when the folder has a manifest and the daemon would load it
with a plain disk format, the daemon's load format is switched to
``manifest_cache``, whose ``load_weights`` verifies every tensor while loading.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

_ORIGINAL = "_ckptpub_original_run_daemon"
_PLAIN_FORMATS = ("auto", "safetensors", "hf")


def _daemon_module() -> Any:  # a module of vLLM, which is untyped for mypy here
    from vllm.model_executor.model_loader.weight_cache import daemon

    return daemon


_LAUNCHERS = (
    "vllm.entrypoints.cli.preload",
    "vllm.model_executor.model_loader.weight_cache.daemon",
)


def install(force: bool = False) -> None:
    """Make ``vllm preload`` spawn :func:`run_daemon` (idempotent).

    Only processes that can launch daemons need this (the ``vllm`` CLI imports the
    ``preload`` module before it loads plugins); engine cores and workers skip it
    and the half-second import of the daemon module, unless ``force``.
    """
    if not force and not any(name in sys.modules for name in _LAUNCHERS):
        return
    module = _daemon_module()
    if module._run_daemon is run_daemon:
        return
    setattr(module, _ORIGINAL, module._run_daemon)
    module._run_daemon = run_daemon


def _vllm_run_daemon() -> Callable[..., None]:
    module = _daemon_module()
    original: Callable[..., None] = getattr(module, _ORIGINAL, module._run_daemon)
    if original is run_daemon:  # pragma: no cover - would recurse
        raise RuntimeError("ckptpub: vLLM's _run_daemon was lost")
    return original


def _upgrade_load_format(vllm_config: Any) -> None:
    from vllm.config import VllmConfig

    from . import LOAD_FORMAT
    from .key import folder_of, has_manifest
    from .log import logger

    if not isinstance(vllm_config, VllmConfig):
        return
    load_config = vllm_config.load_config
    folder = folder_of(vllm_config.model_config.model, vllm_config.model_config.revision)
    if (
        load_config.load_format in _PLAIN_FORMATS
        and not load_config.model_loader_extra_config
        and has_manifest(folder)
    ):
        logger.info(
            "ckptpub: weight-cache daemon loads %s with --load-format %s (verified)", folder, LOAD_FORMAT
        )
        load_config.load_format = LOAD_FORMAT


def run_daemon(*args: Any, **kwargs: Any) -> None:
    """Install the plugin in this (daemon) process, then run vLLM's ``_run_daemon``."""
    from . import register
    from .key import checkpoint_key
    from .log import logger

    register()
    install(force=True)
    for value in list(args) + list(kwargs.values()):
        if type(value).__name__ == "VllmConfig":
            _upgrade_load_format(value)
            logger.info(
                "ckptpub: weight-cache daemon for %s is keyed by checkpoint %s",
                value.model_config.model,
                checkpoint_key(value.model_config.model),
            )
    return _vllm_run_daemon()(*args, **kwargs)
