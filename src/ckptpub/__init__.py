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

The package is layered; each layer is a private subpackage whose docstring maps its
modules, and imports go downwards only (``tests/core/test_layers.py`` checks it):

    (public)      ckptpub (this API), cli, console, signing, distributed, integration, errors
    _cli          the command line: parser, built-in commands, printing, progress
    _training     the Trainer callback, a run's base model, the accelerate helper
    _runs         a run's checkpoints at a glance (ls, log)
    _operations   publish, verify, diff and explain, sign
    _hashing      the hashing engine, its options, distributed hashing
    _filesystem   safe opens and reads, folder scans, atomic JSON files, model files, the run index,
                  models in the Hugging Face cache
    _format       the manifest (ckptpub/3 regions), config meaning, safetensors headers,
                  strict and canonical JSON, digests
    errors, _settings, _version   what every layer may import

``docs/design.md`` (for contributors) says what each layer may import, where each
rule lives and how to add a command, a format field or an integration.
"""

from __future__ import annotations

import importlib

from ._version import __version__ as __version__

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (10 ms of a start-up a Ctrl-C may land in).
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

    from ._filesystem.read import read_manifest
    from ._filesystem.run_index import read as read_run_index
    from ._format.digest import digest_bytes as tensor_digest
    from ._format.manifest import FileRecord, Manifest, TensorRecord, config_digest
    from ._format.names import MANIFEST_NAME
    from ._operations.diff import ManifestDiff, diff_manifests
    from ._operations.publishing import build_manifest, publish
    from ._operations.verify import Problem, VerifyReport, verify
    from ._training.callback import PublishCallback, publish_accelerate_state
    from .errors import CkptpubError, NoManifestError

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
    "MANIFEST_NAME": ("._format.names", "MANIFEST_NAME"),
    "CkptpubError": (".errors", "CkptpubError"),
    "FileRecord": ("._format.manifest", "FileRecord"),
    "Manifest": ("._format.manifest", "Manifest"),
    "ManifestDiff": ("._operations.diff", "ManifestDiff"),
    "NoManifestError": (".errors", "NoManifestError"),
    "Problem": ("._operations.verify", "Problem"),
    "PublishCallback": ("._training.callback", "PublishCallback"),
    "TensorRecord": ("._format.manifest", "TensorRecord"),
    "VerifyReport": ("._operations.verify", "VerifyReport"),
    "build_manifest": ("._operations.publishing", "build_manifest"),
    "config_digest": ("._format.manifest", "config_digest"),
    "diff_manifests": ("._operations.diff", "diff_manifests"),
    "publish": ("._operations.publishing", "publish"),
    "publish_accelerate_state": ("._training.callback", "publish_accelerate_state"),
    "read_manifest": ("._filesystem.read", "read_manifest"),
    "read_run_index": ("._filesystem.run_index", "read"),
    "tensor_digest": ("._format.digest", "digest_bytes"),
    "verify": ("._operations.verify", "verify"),
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
