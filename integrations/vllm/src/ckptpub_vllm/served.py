"""What this engine serves, by identity, where tools already look.

The process that starts an engine records each model it serves (``frontend``, once the
start checks passed, with the identity the workers are pinned to), and the OpenAI
server shows the records:

* ``/metrics``: ``ckptpub:served_info{name, kind, identity, base_identity, folder} 1``, an
  info metric in the form vLLM's own take (``vllm:cache_config_info``): a gauge
  permanently 1, which Prometheus' multiprocess mode supports and ``Info`` does not;
* ``/v1/models``: each card whose ``root`` is a recorded folder carries
  ``"ckptpub": {"identity": ..., "kind": ..., "base_identity": ...}`` (the OpenAI model
  card allows extra fields; vLLM's ``ModelCard`` keeps them).

Adapters are one :func:`record` away: whatever serves an adapter records it with
``kind="adapter"`` and its base's identity, and its card (``root`` = the adapter's
path) and metric follow.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import ckptpub

_PATCH_MARK = "_ckptpub_served"
METRIC = "ckptpub:served_info"
_LABELS = ("name", "kind", "identity", "base_identity", "folder")


@dataclass(frozen=True)
class Served:
    """One model (or adapter) this engine serves."""

    name: str
    kind: str  # "model" | "adapter"
    identity: str
    folder: str
    base_identity: str | None = None

    def card(self) -> dict[str, Any]:
        return {"identity": self.identity, "kind": self.kind, "base_identity": self.base_identity}


_served: dict[str, Served] = {}
_gauge: Any = None


def record(served: Served) -> None:
    """Record what is served under ``served.folder``: its metric is set, its model card shows it."""
    global _gauge
    previous = _served.get(served.folder)
    _served[served.folder] = served
    try:
        import prometheus_client
    except ImportError:  # pragma: no cover - vLLM depends on it
        return
    if _gauge is None:
        _gauge = prometheus_client.Gauge(
            METRIC,
            "What this engine serves, by ckptpub identity (always 1)",
            labelnames=_LABELS,
            multiprocess_mode="mostrecent",
        )
    if previous is not None and previous != served:
        _gauge.remove(*_label_values(previous))
    _gauge.labels(*_label_values(served)).set(1)


def _label_values(served: Served) -> tuple[str, ...]:
    return (served.name, served.kind, served.identity, served.base_identity or "", served.folder)


def lookup(folder: str | None) -> Served | None:
    """What is recorded for ``folder`` (as given, or the same folder by another spelling)."""
    if not folder:
        return None
    if folder in _served:
        return _served[folder]
    real = os.path.realpath(folder)
    return next((s for s in _served.values() if os.path.realpath(s.folder) == real), None)


def record_model(model_config: Any, manifest: ckptpub.Manifest) -> None:
    """Record the engine's model (the manifest its start checks passed) and show it on model cards."""
    from ckptpub.integration import base_of

    names = model_config.served_model_name
    name = names[0] if isinstance(names, list | tuple) and names else str(names or model_config.model)
    record(Served(name, "model", manifest.identity, model_config.model, base_of(manifest)))
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
            served = lookup(card.root)
            if served is not None:
                card.ckptpub = served.card()
        return models

    setattr(show_available_models, _PATCH_MARK, True)
    OpenAIServingModels.show_available_models = show_available_models
