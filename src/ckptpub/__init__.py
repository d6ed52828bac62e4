"""ckptpub: BLAKE3 manifests that say exactly which model a checkpoint folder holds.

>>> import ckptpub
>>> manifest = ckptpub.publish("runs/demo/checkpoint-20")   # doctest: +SKIP
>>> ckptpub.verify("runs/demo/checkpoint-20").ok            # doctest: +SKIP
True

``import ckptpub`` needs only the standard library and ``blake3``, and imports nothing
until a name is used (PEP 562): the ``ckptpub`` command imports the modules it needs
inside its own Ctrl-C handling (``console``), and a program that uses one function
pays for that function's modules only. The Trainer callback's two names have
transformers behind them.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"
#: ``typing.TYPE_CHECKING`` without importing ``typing`` (10 ms of a start-up a Ctrl-C may land in).
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

    from .callback import PublishCallback, publish_accelerate_state
    from .compare import ManifestDiff, Problem, VerifyReport, diff_manifests, verify
    from .errors import CkptpubError, NoManifestError
    from .hashing import digest_bytes as tensor_digest
    from .manifest import MANIFEST_NAME, FileRecord, Manifest, TensorRecord, config_digest
    from .publishing import build_manifest, publish
    from .read import read_manifest
    from .run_index import read as read_run_index

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
#: Each public name: (the module that defines it, its name there).
_WHERE = {
    "MANIFEST_NAME": (".manifest", "MANIFEST_NAME"),
    "CkptpubError": (".errors", "CkptpubError"),
    "FileRecord": (".manifest", "FileRecord"),
    "Manifest": (".manifest", "Manifest"),
    "ManifestDiff": (".compare", "ManifestDiff"),
    "NoManifestError": (".errors", "NoManifestError"),
    "Problem": (".compare", "Problem"),
    "PublishCallback": (".callback", "PublishCallback"),
    "TensorRecord": (".manifest", "TensorRecord"),
    "VerifyReport": (".compare", "VerifyReport"),
    "build_manifest": (".publishing", "build_manifest"),
    "config_digest": (".manifest", "config_digest"),
    "diff_manifests": (".compare", "diff_manifests"),
    "publish": (".publishing", "publish"),
    "publish_accelerate_state": (".callback", "publish_accelerate_state"),
    "read_manifest": (".read", "read_manifest"),
    "read_run_index": (".run_index", "read"),
    "tensor_digest": (".hashing", "digest_bytes"),
    "verify": (".compare", "verify"),
}


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (then kept as an attribute)."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'ckptpub' has no attribute {name!r}")
    value = getattr(importlib.import_module(where[0], __name__), where[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
