"""ckptpub: BLAKE3 manifests that say exactly which model a checkpoint folder holds.

>>> import ckptpub
>>> manifest = ckptpub.publish("runs/demo/checkpoint-20")   # doctest: +SKIP
>>> ckptpub.verify("runs/demo/checkpoint-20").ok            # doctest: +SKIP
True

``import ckptpub`` needs only the standard library and ``blake3``. The Trainer
callback's two names are loaded on first use (PEP 562): transformers is behind them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from .compare import ManifestDiff, Problem, VerifyReport, diff_manifests, verify
from .errors import CkptpubError, NoManifestError
from .hashing import digest_bytes as tensor_digest
from .manifest import MANIFEST_NAME, FileRecord, Manifest, TensorRecord, config_digest
from .publishing import build_manifest, publish
from .read import read_manifest
from .run_index import read as read_run_index

if TYPE_CHECKING:
    from .callback import PublishCallback, publish_accelerate_state

__all__ = [
    "MANIFEST_NAME",
    "CkptpubError",
    "FileRecord",
    "Manifest",
    "ManifestDiff",
    "NoManifestError",
    "Problem",
    "PublishCallback",
    "TensorRecord",
    "VerifyReport",
    "build_manifest",
    "config_digest",
    "diff_manifests",
    "publish",
    "publish_accelerate_state",
    "read_manifest",
    "read_run_index",
    "tensor_digest",
    "verify",
]


def __getattr__(name: str) -> Any:
    """``PublishCallback`` and ``publish_accelerate_state`` import transformers: only when asked for."""
    if name in ("PublishCallback", "publish_accelerate_state"):
        from . import callback

        return getattr(callback, name)
    raise AttributeError(f"module 'ckptpub' has no attribute {name!r}")
