"""A hub id given to a ``manifest_cache`` engine: resolved by ckptpub, in the cache, before vLLM asks a hub.

vLLM resolves a model's hub id itself, before any loader or check of the plugin runs:
with ``HF_HUB_OFFLINE=1`` in ``EngineArgs.__post_init__`` (``get_model_path``, right
after it loads the plugins: huggingface_hub's ``LocalEntryNotFoundError`` for an id not
in the cache), otherwise in ``EngineArgs.create_engine_config`` (transformers' config
lookup asks the hub: with no DNS that fails after about 100 s, on a network that never
answers it waits minutes). For ``manifest_cache`` the plugin resolves the id first, at
whichever of the two comes first, with the core's ``model_folder`` (the cache alone, no
network; its ref and snapshot names checked), and hands vLLM the snapshot's path, as
vLLM's own offline mode does. So the engine asks no hub about the model, reads its
config and tokenizer from the folder ckptpub checks, and an id that is not in the cache,
or a ref that is not a commit hash, is refused in ckptpub's one line with the commands to
run. A tokenizer named apart from the model (``tokenizer=``) is not the checkpoint's and
stays vLLM's to resolve; any other load format is left to vLLM entirely.
"""

from __future__ import annotations

import sys
from typing import Any

from ckptpub.serving import model_folder

from ..shared.options import LOAD_FORMAT
from ..shared.refusals import refusals_logged

_PATCH_MARK = "_ckptpub_hub_ids"


def install() -> None:
    """Wrap vLLM's ``get_model_path`` as ``EngineArgs.__post_init__`` calls it (idempotent).

    It is looked up in ``arg_utils`` when called, after vLLM loaded the plugins, so the
    wrapper applies to the very ``EngineArgs`` whose plugin loading installed it.
    """
    from vllm.engine import arg_utils

    original = arg_utils.get_model_path
    if getattr(original, _PATCH_MARK, False):
        return

    def get_model_path(model: Any, revision: str | None = None) -> Any:
        engine_args = sys._getframe(1).f_locals.get("self")  # the EngineArgs of __post_init__, if it called
        if (
            isinstance(engine_args, arg_utils.EngineArgs)
            and verified(engine_args)
            and model == engine_args.model
        ):
            return snapshot_of(str(model), revision)
        return original(model, revision)

    setattr(get_model_path, _PATCH_MARK, True)
    arg_utils.get_model_path = get_model_path


def pin_snapshot(engine_args: Any) -> None:
    """For ``manifest_cache``: ``engine_args.model`` becomes the folder it names, before vLLM resolves it
    (a path stays as given; a hub id becomes its checked snapshot, or is refused)."""
    if verified(engine_args):
        engine_args.model = snapshot_of(str(engine_args.model), engine_args.revision)


def verified(engine_args: Any) -> bool:
    """Whether the engine loads through ``manifest_cache``."""
    return str(getattr(engine_args, "load_format", "")) == LOAD_FORMAT


def snapshot_of(model: str, revision: str | None) -> str:
    """The core's ``model_folder``: a refusal is logged (and relayed) in its own words."""
    with refusals_logged(model):
        return model_folder(model, revision)
