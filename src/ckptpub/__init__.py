"""ckptpub: BLAKE3 manifests that say exactly which model a checkpoint folder holds.

>>> import ckptpub
>>> manifest = ckptpub.publish("runs/demo/checkpoint-20")   # doctest: +SKIP
>>> ckptpub.verify("runs/demo/checkpoint-20").ok            # doctest: +SKIP
True

``import ckptpub`` needs only the standard library and ``blake3``; the Trainer
callback imports transformers when it is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from .compare import ManifestDiff, Problem, VerifyReport, diff_manifests, verify  # noqa: E402
from .errors import CkptpubError  # noqa: E402
from .hashing import digest_bytes as tensor_digest  # noqa: E402
from .manifest import MANIFEST_NAME, FileRecord, Manifest, TensorRecord  # noqa: E402
from .publish import build_manifest, publish  # noqa: E402
from .read import read_manifest  # noqa: E402

if TYPE_CHECKING:
    from .callback import PublishCallback, publish_accelerate_state

__all__ = [
    "MANIFEST_NAME",
    "CkptpubError",
    "FileRecord",
    "Manifest",
    "ManifestDiff",
    "Problem",
    "PublishCallback",
    "TensorRecord",
    "VerifyReport",
    "build_manifest",
    "diff_manifests",
    "publish",
    "publish_accelerate_state",
    "read_manifest",
    "tensor_digest",
    "verify",
]

_LAZY = {"PublishCallback", "publish_accelerate_state"}


def __getattr__(name: str) -> Any:
    """Import the Trainer integration (and with it transformers) only when it is asked for."""
    if name in _LAZY:
        from . import callback

        return getattr(callback, name)
    raise AttributeError(f"module 'ckptpub' has no attribute {name!r}")
