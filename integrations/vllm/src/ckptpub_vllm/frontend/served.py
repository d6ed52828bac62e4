"""What this engine serves, by identity, where tools already look.

The process that starts an engine records the model it serves (``frontend``, once the
start checks passed, with the identity the workers are pinned to). Adapters come and
go, and a worker reads one again whenever vLLM's CPU cache evicted it (from a folder
that may have been published again since), so what the server shows of them is asked
of the workers each time it shows it (:func:`refresh_adapters`): each name the server
serves, with the record of the latest load of its LoRA id in the workers
(``worker.adapters.loaded_adapters``: the name and path it was loaded as, its folder,
identity and base identity). A name whose id the workers hold for another name or
path, or that the workers disagree on, is shown with no identity. The OpenAI server
shows both:

* ``/metrics``: ``ckptpub:served_info{name, kind, identity, base_identity, folder} 1`` for
  the model and for each adapter (``kind`` ``model`` or ``adapter``), an info metric in
  the form vLLM's own take (``vllm:cache_config_info``: a gauge always 1), read from the
  records at each scrape (a middleware refreshes the adapters' first);
* ``/v1/models``: the model's cards (by ``root``, its folder) and each adapter's card
  (by its name) carry ``"ckptpub": {"identity": ..., "kind": ..., "base_identity": ...}``
  (the OpenAI model card allows extra fields; vLLM's ``ModelCard`` keeps them).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ckptpub

from ..shared.log import logger
from ..shared.options import LOAD_FORMAT
from ..worker.adapters import LOADED_METHOD, adapter_folder

_PATCH_MARK = "_ckptpub_served"
METRIC = "ckptpub:served_info"
_LABELS = ("name", "kind", "identity", "base_identity", "folder")


@dataclass(frozen=True)
class Served:
    """One model (or adapter) this engine serves."""

    name: str
    kind: str  # "model" | "adapter"
    identity: str | None  # None: an adapter served without a manifest, or not known to be loaded as shown
    folder: str
    base_identity: str | None = None

    def card(self) -> dict[str, Any]:
        return {"identity": self.identity, "kind": self.kind, "base_identity": self.base_identity}


_models: dict[str, Served] = {}
_adapters: list[Served] = []  # as the workers last said (refresh_adapters)
_collector: Any = None


def served() -> list[Served]:
    """Everything served now: the model, then each adapter (as last asked of the workers)."""
    return [*_models.values(), *_adapters]


def model_served_from(folder: str | None) -> Served | None:
    """The model served from ``folder`` (as given, or the same folder by another spelling)."""
    if not folder:
        return None
    real = adapter_folder(folder)
    return next((s for s in _models.values() if adapter_folder(s.folder) == real), None)


def adapter_named(name: str) -> Served | None:
    return next((a for a in _adapters if a.name == name), None)


async def refresh_adapters(models: Any) -> None:
    """Show each adapter ``models`` (vLLM's ``OpenAIServingModels``) serves with what the workers loaded."""
    global _adapters
    engine = models.engine_client
    if engine.vllm_config.load_config.load_format != LOAD_FORMAT or engine.vllm_config.lora_config is None:
        return
    try:
        per_worker = await engine.collective_rpc(LOADED_METHOD)
        agreed = frozenset.intersection(*(frozenset(tuple(row) for row in rows) for rows in per_worker))
    except Exception as error:  # noqa: BLE001 - shown with no identity rather than a stale one
        logger.warning("ckptpub: cannot ask the workers which adapters they loaded: %s", error)
        agreed = frozenset()
    by_id = {row[0]: row for row in agreed}
    shown = []
    for name, request in list(models.lora_requests.items()):
        row = by_id.get(request.lora_int_id)
        if row is not None and row[1:3] == (name, request.lora_path):
            shown.append(Served(name, "adapter", row[4], row[3], row[5]))
        else:  # not loaded as this name and path in every worker: no identity to show for it
            shown.append(Served(name, "adapter", None, request.lora_path))
    _adapters = shown


class _Collector:
    """``ckptpub:served_info``, collected from the records at each scrape (adapters come and go)."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(
            METRIC, "What this engine serves, by ckptpub identity (always 1)", labels=_LABELS
        )
        for item in served():
            family.add_metric(
                [item.name, item.kind, item.identity or "", item.base_identity or "", item.folder], 1
            )
        yield family


def record_model(model_config: Any, manifest: ckptpub.Manifest) -> None:
    """Record the engine's model (the manifest its start checks passed); show it in metrics and cards."""
    global _collector
    from ckptpub.integration import base_of

    names = model_config.served_model_name
    name = names[0] if isinstance(names, list | tuple) and names else str(names or model_config.model)
    _models.clear()  # a process serves the model of its latest engine
    _models[model_config.model] = Served(
        name, "model", manifest.identity, model_config.model, base_of(manifest)
    )
    if _collector is None:
        from prometheus_client import REGISTRY

        _collector = _Collector()
        REGISTRY.register(_collector)
    _show_on_model_cards()


def _show_on_model_cards() -> None:
    """Add the ``ckptpub`` field to the OpenAI server's ``/v1/models`` cards, and refresh the
    adapters' records before ``/metrics`` is read (idempotent)."""
    try:
        from vllm.entrypoints.openai.models.serving import OpenAIServingModels
        from vllm.entrypoints.serve.instrumentator import metrics
    except ImportError:  # pragma: no cover - a vLLM without the OpenAI server
        return
    original = OpenAIServingModels.show_available_models
    if getattr(original, _PATCH_MARK, False):
        return

    async def show_available_models(self: Any) -> Any:
        await refresh_adapters(self)
        models = await original(self)
        for card in models.data:
            item = adapter_named(card.id) if card.parent is not None else model_served_from(card.root)
            if item is not None:
                card.ckptpub = item.card()
        return models

    setattr(show_available_models, _PATCH_MARK, True)
    OpenAIServingModels.show_available_models = show_available_models
    metrics.attach_router = _refreshing_before_scrapes(metrics.attach_router)


def _refreshing_before_scrapes(attach_router: Any) -> Any:
    """vLLM's ``/metrics`` router, behind a middleware that refreshes the adapters' records first
    (the collector that reads them runs synchronously, where the workers cannot be asked)."""

    def attach(app: Any) -> None:
        attach_router(app)

        async def refresh_before_scrape(request: Any, call_next: Any) -> Any:
            models = getattr(request.app.state, "openai_serving_models", None)
            if models is not None and request.url.path.rstrip("/") == "/metrics":
                await refresh_adapters(models)
            return await call_next(request)

        app.middleware("http")(refresh_before_scrape)

    return attach
