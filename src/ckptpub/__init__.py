"""ckptpub: BLAKE3 manifests that say exactly which model a checkpoint folder holds.

>>> import ckptpub
>>> manifest = ckptpub.publish("runs/demo/checkpoint-20")   # doctest: +SKIP
>>> ckptpub.verify("runs/demo/checkpoint-20").ok            # doctest: +SKIP
True

``import ckptpub`` needs only the standard library and ``blake3``. Names are
loaded on first use (PEP 562), so the CLI imports only what its command needs and
the Trainer callback imports transformers only when it is used.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see records.py)

__version__ = "0.1.0"

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

_WHERE = {
    "MANIFEST_NAME": ("manifest", "MANIFEST_NAME"),
    "CkptpubError": ("errors", "CkptpubError"),
    "FileRecord": ("manifest", "FileRecord"),
    "NoManifestError": ("errors", "NoManifestError"),
    "Manifest": ("manifest", "Manifest"),
    "ManifestDiff": ("compare", "ManifestDiff"),
    "Problem": ("compare", "Problem"),
    "PublishCallback": ("callback", "PublishCallback"),
    "TensorRecord": ("manifest", "TensorRecord"),
    "VerifyReport": ("compare", "VerifyReport"),
    "build_manifest": ("publishing", "build_manifest"),
    "config_digest": ("manifest", "config_digest"),
    "diff_manifests": ("compare", "diff_manifests"),
    "publish": ("publishing", "publish"),
    "publish_accelerate_state": ("callback", "publish_accelerate_state"),
    "read_manifest": ("read", "read_manifest"),
    "read_run_index": ("run_index", "read"),
    "tensor_digest": ("hashing", "digest_bytes"),
    "verify": ("compare", "verify"),
}
__all__ = [
    "CkptpubError",
    "FileRecord",
    "MANIFEST_NAME",
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
    try:
        module, attribute = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module 'ckptpub' has no attribute {name!r}") from None
    import importlib  # here, not at the top: the CLI never needs it

    value = getattr(importlib.import_module(f".{module}", __name__), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
