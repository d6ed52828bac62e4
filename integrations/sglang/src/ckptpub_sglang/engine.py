"""The engine's side of SGLang's weight cache: one decision per load, and no daemon for an unpublished folder.

With the weight cache on, SGLang loads through ``IpcModelLoader.load_model``: it asks
the daemon (``_fetch_from_cache``, which builds the key) and, in client mode with no
daemon there, falls back to its disk loader. The plugin wraps both (AROUND hooks):

* ``load_model`` runs inside ``decision.checked``: the key the engine sends and the
  verified disk fallback use the manifest read once at the start of the load (refused
  there when the policy refuses the folder);
* ``_fetch_from_cache`` answers "no daemon" for a folder without a manifest that the
  policy lets through: SGLang then does what it does without a daemon (client mode:
  loads from disk, unverified; daemon mode: refuses to start), instead of raising
  SGLang's "config mismatch" against a key that matches nothing by design.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .decision import checked, decide
from .log import logger

#: SGLang's engine-side load through the weight cache, and its request to the daemon.
LOAD_TARGET = "sglang.srt.weight_cache.ipc_loader.IpcModelLoader.load_model"
FETCH_TARGET = "sglang.srt.weight_cache.ipc_loader.IpcModelLoader._fetch_from_cache"


def load_model(original: Callable[..., Any], loader: Any, *args: Any, **kwargs: Any) -> Any:
    """The AROUND hook of :data:`LOAD_TARGET`."""
    model_config = kwargs["model_config"]
    with checked(model_config.model_path, model_config.revision):
        return original(loader, *args, **kwargs)


def fetch_from_cache(original: Callable[..., Any], loader: Any, model_config: Any, *args: Any) -> Any:
    """The AROUND hook of :data:`FETCH_TARGET`: None ("no daemon") for a folder without a manifest."""
    if decide(model_config.model_path, model_config.revision).manifest is None:
        logger.warning(
            "ckptpub: %s has no manifest: not asking the weight-cache daemon", model_config.model_path
        )
        return None
    return original(loader, model_config, *args)
