"""What this engine serves, by identity, where tools already look.

The process that starts an engine records the model it serves (``frontend``, once the
start checks passed, with the identity the workers are pinned to); the adapters it
serves are the ones ``worker.adapters.served_adapters`` records (each adapter the OpenAI server
loaded, its identity and its base's). The OpenAI server shows both:

* ``/metrics``: ``ckptpub:served_info{name, kind, identity, base_identity, folder} 1`` for
  the model and for each adapter (``kind`` ``model`` or ``adapter``), an info metric in
  the form vLLM's own take (``vllm:cache_config_info``: a gauge always 1), read from the
  records at each scrape;
* ``/v1/models``: each card whose ``root`` is a served folder (the model's, or an
  adapter's) carries ``"ckptpub": {"identity": ..., "kind": ..., "base_identity": ...}``
  (the OpenAI model card allows extra fields; vLLM's ``ModelCard`` keeps them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ckptpub

from ..worker.adapters import served_adapters

_PATCH_MARK = "_ckptpub_served"
METRIC = "ckptpub:served_info"
_LABELS = ("name", "kind", "identity", "base_identity", "folder")


@dataclass(frozen=True)
class Served:
    """One model (or adapter) this engine serves."""

    name: str
    kind: str  # "model" | "adapter"
    identity: str | None  # None: an adapter served without a manifest (adapter_require_manifest false)
    folder: str
    base_identity: str | None = None

    def card(self) -> dict[str, Any]:
        return {"identity": self.identity, "kind": self.kind, "base_identity": self.base_identity}


_models: dict[str, Served] = {}
_collector: Any = None


def served() -> list[Served]:
    """Everything served now: the model, then each adapter (the latest load of each name)."""
    adapters = [Served(a.name, "adapter", a.identity, a.path, a.base_identity) for a in served_adapters()]
    return [*_models.values(), *adapters]


def lookup(folder: str | None) -> Served | None:
    """What is served from ``folder`` (as given, or the same folder by another spelling)."""
    if not folder:
        return None
    real = os.path.realpath(folder)
    return next((s for s in served() if s.folder == folder or os.path.realpath(s.folder) == real), None)


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
    """Add the ``ckptpub`` field to the OpenAI server's ``/v1/models`` cards (idempotent)."""
    try:
        from vllm.entrypoints.openai.models.serving import OpenAIServingModels
    except ImportError:  # pragma: no cover - a vLLM without the OpenAI server
        return
    original = OpenAIServingModels.show_available_models
    if getattr(original, _PATCH_MARK, False):
        return

    async def show_available_models(self: Any) -> Any:
        models = await original(self)
        for card in models.data:
            item = lookup(card.root)
            if item is not None:
                card.ckptpub = item.card()
        return models

    setattr(show_available_models, _PATCH_MARK, True)
    OpenAIServingModels.show_available_models = show_available_models
