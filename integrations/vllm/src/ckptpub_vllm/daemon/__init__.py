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
``manifest_cache``, whose ``load_weights`` verifies every tensor while loading,
against the very manifest object the key was computed from (:func:`run_daemon`).
A daemon of an ``s3://`` model is keyed the same way: by one GET of the bucket's
``ckptpub.json`` (never vLLM's pulled copy of it), its pulled files checked against it,
its weights streamed from the bucket and verified (``shared.object_store``).
What the plugin adds to the daemon while it serves (reports, taking over a socket
path, hand-over) is in :mod:`.serving`.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import ckptpub
from ckptpub.serving import RefusedError, has_manifest, model_folder

from ..shared import daemon_reports, key
from ..shared.key import checked, folder_of, read_folder_manifest
from ..shared.log import logger
from ..shared.object_store import Location, locate, object_store_url
from ..shared.options import LOAD_FORMAT, split_extra_config, unverified_daemon_load
from ..shared.refusals import refusals_logged
from ..shared.startup import check_before_start
from ..worker import loader
from . import serving

_ORIGINAL = "_ckptpub_original_run_daemon"


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


def _upgrade_load_format(vllm_config: Any, folder: str) -> None:
    """A daemon of a folder with a manifest loads through ``manifest_cache``, or refuses to start.

    Its key is the manifest's identity (``shared.key``), so the weights it holds must be
    verified to be the identity's: a plain disk format (``auto``, ``safetensors``, ``hf``)
    with no extra config is switched to ``manifest_cache``, whose load verifies every
    tensor; any other format, or extra config for vLLM's own loader, would load
    unverified bytes under the published identity (``shared.options.unverified_daemon_load``):
    refused in one line (fail closed), before anything is keyed or loaded.
    """
    load_config = vllm_config.load_config
    requested = str(load_config.load_format)
    if requested == LOAD_FORMAT or not has_manifest(folder):  # one HEAD for an s3:// prefix
        return
    unverified = unverified_daemon_load(requested, load_config.model_loader_extra_config)
    if unverified is None:
        logger.info(
            "ckptpub: weight-cache daemon loads %s with --load-format %s (verified)", folder, LOAD_FORMAT
        )
        load_config.load_format = LOAD_FORMAT
        return
    raise RefusedError(
        folder,
        f"a weight-cache daemon keyed by its manifest's identity loads only through a verifying loader, "
        f"and {unverified} does not verify",
        hint=f"start it with --load-format {LOAD_FORMAT} (its options in --model-loader-extra-config)",
    )


def _daemon_model(
    original: Callable[..., None], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, Any] | None:
    """(``VllmConfig``, ``ModelConfig``) of the model ``_run_daemon(*args, **kwargs)`` loads, or None.

    Arguments are bound to vLLM's own signature, so a draft daemon (``is_draft``) names
    its draft model, whatever the position of the argument in this vLLM version.
    """
    try:
        bound = inspect.signature(original).bind(*args, **kwargs).arguments
    except TypeError:
        return None
    config: Any = bound.get("vllm_config")
    if type(config).__name__ != "VllmConfig":
        return None
    model_config = config.model_config
    if bound.get("is_draft") and config.speculative_config is not None:
        model_config = config.speculative_config.draft_model_config
    return config, model_config


def manifest_folder(vllm_config: Any, model: str, revision: str | None) -> str:
    """Where the daemon of ``model`` reads its manifest (that folder, or a hub id's snapshot), resolved once.

    Found as the key finds it (``shared.key.folder_of``); a folder with a manifest switches a
    plain load format to ``manifest_cache`` (``_upgrade_load_format``), which, as the
    engine's loader does, refuses a hub id with no snapshot in the cache
    (``ckptpub.serving.model_folder``). The key and the load take this folder (``shared.key.checked``).
    """
    folder = folder_of(model, revision)
    _upgrade_load_format(vllm_config, folder)
    if vllm_config.load_config.load_format == LOAD_FORMAT and folder == model:
        return model_folder(model, revision)
    return folder


def daemon_location(vllm_config: Any, model_config: Any) -> Location:
    """``manifest_folder`` for any model: an object-store model's ``s3://`` prefix (its format switched
    or refused by the same rule) with vLLM's pulled copy of its small files, or a folder."""
    if object_store_url(model_config) is None:
        return Location(manifest_folder(vllm_config, str(model_config.model), model_config.revision))
    location = locate(model_config)
    _upgrade_load_format(vllm_config, location.folder)
    return location


def keyed_manifest(vllm_config: Any, folder: str, copy: str | None = None) -> ckptpub.Manifest | None:
    """The daemon's one read of ``folder``'s manifest, with every check its load would apply.

    With ``manifest_cache`` these are the engine's start-time checks (pin, signature,
    engine files, in vLLM's pulled ``copy`` for an object-store model). Another load
    format is left only for a folder that had no manifest (``_upgrade_load_format``): one
    found now appeared since, and would key a daemon whose load verifies nothing by a
    published identity, so it is refused (fail closed). The object returned keys the
    daemon, is what its load verifies every tensor against, and is what it reports
    (``daemon_reports.KEYED``).
    """
    load_config = vllm_config.load_config
    if load_config.load_format == LOAD_FORMAT:
        options, _ = split_extra_config(load_config.model_loader_extra_config)
        return check_before_start(folder, options, copy)
    manifest = read_folder_manifest(folder)
    if manifest is not None:
        raise RefusedError(
            folder,
            f"{ckptpub.MANIFEST_NAME} appeared while the daemon started, and its load format "
            f"{load_config.load_format!r} does not verify",
            hint="start the daemon again: a published folder is loaded through " + LOAD_FORMAT,
        )
    return None


def run_daemon(*args: Any, **kwargs: Any) -> None:
    """Install the plugin in this (daemon) process, then run vLLM's ``_run_daemon`` keyed by one manifest.

    What a daemon needs, and only that, from the layers below (not the package's
    ``register``, which also patches front ends and engine cores): the key
    (``shared.key``), the ``manifest_cache`` loader its load goes through
    (``worker.loader``), this wrapper, what the daemon adds while it serves
    (:mod:`.serving`) and its reports (``shared.daemon_reports``).

    The manifest is read once, here; the key vLLM computes in ``WeightCacheDaemon.__init__``
    and the verified load in ``load_weights`` both take that object (``shared.key.checked``,
    in force for the daemon's whole life), so swapping another manifest in between
    cannot make the daemon load, or report, anything but the identity it is keyed by.
    """
    key.install()
    loader.install()
    install(force=True)
    serving.install()
    daemon_reports.enable()
    original = _vllm_run_daemon()
    found = _daemon_model(original, args, kwargs)
    if found is None:  # pragma: no cover - another vLLM's signature: run it unchanged
        return original(*args, **kwargs)
    vllm_config, model_config = found
    model = str(model_config.model)
    with refusals_logged(model):
        location = daemon_location(vllm_config, model_config)
        folder = location.folder
        manifest = keyed_manifest(vllm_config, folder, location.copy)
    daemon_reports.report(
        daemon_reports.KEYED, folder=folder, identity=manifest.identity if manifest is not None else None
    )
    with checked(model, manifest, folder):
        try:
            return original(*args, **kwargs)
        except serving.HandOver as handed:
            serving.keep_weights_for_mapped_engines(handed)
    return None
