"""ckptpub: BLAKE3 manifests that say exactly which model a checkpoint folder holds.

>>> import ckptpub
>>> manifest = ckptpub.publish("runs/demo/checkpoint-20")   # doctest: +SKIP
>>> ckptpub.verify("runs/demo/checkpoint-20").ok            # doctest: +SKIP
True

``import ckptpub`` needs only the standard library and ``blake3``. The Trainer
callback's two names are loaded on first use (PEP 562): transformers is behind them.

The package is layered; each layer is a private subpackage whose docstring maps its
modules, and imports go downwards only (``tests/core/test_layers.py`` checks it):

    (public)      ckptpub (this API), cli, signing, distributed, integration, errors
    _cli          the command line: parser, built-in commands, printing, progress
    _training     the Trainer callback, the accelerate helper
    _runs         a run's checkpoints at a glance (ls, log)
    _operations   publish, verify, diff and explain, sign
    _hashing      the hashing engine, its options, distributed hashing
    _filesystem   safe opens and reads, folder scans, atomic JSON files, model files, the run index
    _format       the manifest, its tables, safetensors headers, strict and canonical JSON, digests
    errors, _version   what every layer may import
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._filesystem.read import read_manifest
from ._filesystem.run_index import read as read_run_index
from ._format.digest import digest_bytes as tensor_digest
from ._format.manifest import MANIFEST_NAME, FileRecord, Manifest, TensorRecord, config_digest
from ._operations.diff import ManifestDiff, diff_manifests
from ._operations.publishing import build_manifest, publish
from ._operations.verify import Problem, VerifyReport, verify
from ._version import __version__ as __version__
from .errors import CkptpubError, NoManifestError

if TYPE_CHECKING:
    from ._training.callback import PublishCallback, publish_accelerate_state

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
        from ._training import callback

        return getattr(callback, name)
    raise AttributeError(f"module 'ckptpub' has no attribute {name!r}")
