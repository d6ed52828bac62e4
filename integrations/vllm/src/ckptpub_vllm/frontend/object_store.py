"""``--load-format manifest_cache`` for models in object storage, past vLLM's config check.

vLLM's ``VllmConfig.try_verify_and_update_config`` (``config/vllm.py``, 0.32 and 0.33)
refuses any load format but its own object-store loaders (``runai_streamer``,
``runai_streamer_sharded``, ``modelexpress``) for a model whose ``model_weights`` is an
``s3://``, ``gs://`` or ``az://`` URL, before any plugin loader runs. ``manifest_cache``
streams such a model with vLLM's own ``runai_streamer`` and verifies every tensor
(``worker.loader.VerifyingStreamLoader``), so the smallest change that lets it through is
this: while that one method runs, a ``manifest_cache`` load format reads as
``runai_streamer``, and it is put back when the method returns or raises. Nothing else
of the check changes: every other format is refused as vLLM refuses it, and ``auto``
still becomes ``runai_streamer``. ``integrations/vllm/compat/check_vllm_api.py`` checks
that the method, and the check inside it, are still there in each vLLM it reads.
"""

from __future__ import annotations

from typing import Any

from ..shared.object_store import STREAMER, object_store_url
from ..shared.options import LOAD_FORMAT

_PATCH_MARK = "_ckptpub_object_store"


def install() -> None:
    """Wrap ``VllmConfig.try_verify_and_update_config`` (idempotent)."""
    from vllm.config import VllmConfig

    original = VllmConfig.try_verify_and_update_config
    if getattr(original, _PATCH_MARK, False):
        return

    def try_verify_and_update_config(self: Any) -> Any:
        load_config = self.load_config
        if (
            load_config is None
            or load_config.load_format != LOAD_FORMAT
            or object_store_url(self.model_config) is None
        ):
            return original(self)
        load_config.load_format = STREAMER  # what vLLM's object-store check admits
        try:
            return original(self)
        finally:
            load_config.load_format = LOAD_FORMAT

    setattr(try_verify_and_update_config, _PATCH_MARK, True)
    VllmConfig.try_verify_and_update_config = try_verify_and_update_config
