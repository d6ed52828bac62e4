"""A model vLLM serves from object storage: where its manifest and weights are, and where its small files are.

For ``vllm serve s3://bucket/prefix`` vLLM pulls the prefix's small files (``*.json``,
``*.model``, ``*.py``, and for the tokenizer everything but weights) into
``VLLM_ASSETS_CACHE/model_streamer/<sha256(url)[:8]>``, makes that folder
``model_config.model`` and keeps the URL in ``model_config.model_weights``; the weights
are streamed from the bucket. That folder is keyed by the URL and never cleaned: a file
deleted from the bucket stays in it, and its ``ckptpub.json`` is whatever was pulled last.
So the plugin never reads the copy's manifest: the manifest (and the cache key) is one
GET of the bucket's own ``ckptpub.json`` (``ckptpub.serving``), and the copy's files,
which vLLM reads itself, are checked against that manifest (``shared.startup``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ckptpub.serving import model_folder

#: The loader vLLM's config check admits for object-store models, whose streamer ``manifest_cache`` uses.
STREAMER = "runai_streamer"
#: vLLM's folder of pulled copies, under its assets cache (``transformers_utils/runai_utils.py``).
PULLED = "model_streamer"


@dataclass(frozen=True)
class Location:
    """``folder``: where the manifest and the weights are (a folder, a hub id's snapshot, an ``s3://``
    prefix). ``copy``: for an object-store model, the local folder vLLM pulled its small files into
    (``model_config.model``), which it reads them from; None otherwise (it reads them in ``folder``)."""

    folder: str
    copy: str | None = None


def object_store_url(model_config: Any) -> str | None:
    """The object-store URL vLLM streams the model's weights from (``model_weights``), or None."""
    from vllm.transformers_utils.runai_utils import is_runai_obj_uri

    weights = getattr(model_config, "model_weights", "")
    return weights if isinstance(weights, str) and weights and is_runai_obj_uri(weights) else None


def locate(model_config: Any) -> Location:
    """Where ``model_config``'s model is: its URL (as ``ckptpub.serving.model_folder`` names it; another
    store's scheme is refused) and vLLM's copy, or the folder its ``model`` names at its ``revision``."""
    url = object_store_url(model_config)
    if url is not None:
        return Location(model_folder(url), str(model_config.model))
    return Location(model_folder(model_config.model, model_config.revision))


def is_pulled_copy(folder: str) -> bool:
    """Whether ``folder`` is one of vLLM's pulled copies of an object-store model (its ``ckptpub.json``
    may be stale: never a manifest to trust).

    Only a folder whose parent is named ``model_streamer`` can be one, so vLLM (3 s of imports in
    a process that has not loaded it, such as the preload tests' stand-in daemon) is asked where
    its assets cache is only then.
    """
    parent = os.path.dirname(os.path.abspath(folder))
    if os.path.basename(parent) != PULLED:
        return False
    from vllm.assets.base import get_cache_dir

    return parent == os.path.join(os.path.abspath(get_cache_dir()), PULLED)
