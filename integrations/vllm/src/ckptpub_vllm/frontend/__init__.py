"""What the plugin does in the process that starts an engine (``LLM(...)``, the OpenAI server).

vLLM builds its configuration there (``EngineArgs.create_engine_config``) and only then
starts the engine core and workers, which load the weights a minute later and report
any failure as "Engine core initialization failed. See root cause above." So, for
``--load-format manifest_cache``, at config time, in this process:

* a **hub id** is resolved by ckptpub, in the cache, before vLLM's own lookups ask a hub
  (:mod:`.hub_ids`): vLLM is handed the snapshot's path, or the id is refused;
* **options** are checked by building the loader (ours and vLLM's ``ipc_cache`` keys):
  a bad value of ``--model-loader-extra-config`` is a ``ValueError`` before any engine
  process starts;
* **the start checks** run (``shared.startup.check_before_start``: the manifest, its
  signature, the pin, the engine files): a refusal is raised here, in one line, as the
  last thing the start prints;
* **the identity** it checked is pinned for the workers (``expect_identity``, unless the
  user pinned one), so what this process reports serving is what the workers serve, or
  they refuse (a re-publish between the two reads);
* a **refusal made in a worker** while loading (a tensor that differs, a daemon holding
  another identity with ``fallback: false``) is written by the worker to a file this
  process makes for each start and names in ``CKPTPUB_REFUSAL_FILE`` (``shared.refusals``),
  and raised here instead of vLLM's generic startup error;
* the **served identity** is recorded for tools (:mod:`.served`: ``/metrics`` and
  ``/v1/models`` of the OpenAI server).

A refused LoRA adapter reaches the caller of its request in this process too
(:mod:`.adapters`, installed with the rest by :func:`install`). A model in object storage
(``s3://``) gets past vLLM's config check with ``manifest_cache`` (:mod:`.object_store`);
its start checks read the bucket's manifest and check vLLM's pulled copy of its small files.
"""

from __future__ import annotations

from typing import Any

from ..shared.object_store import locate
from ..shared.options import LOAD_FORMAT
from ..shared.refusals import end_relay, refusals_logged, relayed_refusal, start_relay
from ..shared.startup import check_before_start
from ..worker.loader import ManifestCacheLoader
from . import adapters, hub_ids, object_store, served

_PATCH_MARK = "_ckptpub_frontend"


def install() -> None:
    """Wrap ``EngineArgs.create_engine_config`` (idempotent; the rest is installed when it first runs),
    vLLM's resolution of a hub id (``hub_ids.install``), the front ends' handling of refused adapters
    (``adapters.install``) and vLLM's object-store config check (``object_store.install``)."""
    from vllm.engine.arg_utils import EngineArgs

    adapters.install()
    hub_ids.install()
    object_store.install()
    original = EngineArgs.create_engine_config
    if getattr(original, _PATCH_MARK, False):
        return

    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        hub_ids.pin_snapshot(self)  # before vLLM's own config lookup, which may ask the hub
        vllm_config = original(self, *args, **kwargs)
        check_at_config_time(vllm_config)
        return vllm_config

    setattr(create_engine_config, _PATCH_MARK, True)
    EngineArgs.create_engine_config = create_engine_config


def check_at_config_time(vllm_config: Any) -> None:
    """For ``manifest_cache``: options, start checks, the pin for the workers, the relay, the record."""
    load_config = vllm_config.load_config
    if load_config.load_format != LOAD_FORMAT:
        return
    loader = ManifestCacheLoader(load_config)  # ValueError for a bad option, ours or vLLM's
    model_config = vllm_config.model_config
    with refusals_logged(model_config.model):
        # a hub id's snapshot or an s3:// prefix, as the workers' loader finds it (``_prepare``)
        location = locate(model_config)
        manifest = check_before_start(location.folder, loader.options, location.copy)
    if manifest is None:
        return
    extra = load_config.model_loader_extra_config
    if isinstance(extra, dict):
        extra.setdefault("expect_identity", manifest.identity)
    _relay_refusals_from_workers()
    served.record_model(vllm_config.model_config, manifest)


def _relay_refusals_from_workers() -> None:
    """Make a relay file for this engine start's processes, and raise what they write to it."""
    from vllm.v1.engine import utils as engine_utils

    start_relay()
    original = engine_utils.wait_for_engine_startup
    if getattr(original, _PATCH_MARK, False):
        return

    def wait_for_engine_startup(*args: Any, **kwargs: Any) -> Any:
        try:
            started = original(*args, **kwargs)
        except RuntimeError as error:
            refusal = relayed_refusal()
            end_relay()
            if refusal is None:
                raise
            raise refusal from error
        end_relay()  # started: later refusals (adapters) are the requests'
        return started

    setattr(wait_for_engine_startup, _PATCH_MARK, True)
    engine_utils.wait_for_engine_startup = wait_for_engine_startup
