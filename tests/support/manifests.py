"""A manifest with some fields replaced: how tests forge a manifest or compare two less their provenance."""

from __future__ import annotations

from typing import Any

from ckptpub import Manifest
from ckptpub._format.manifest import FORMAT


def replaced(manifest: Manifest, **changes: Any) -> Manifest:
    """A copy of ``manifest`` with ``changes`` (any of identity, files, weights, config, provenance).

    The tensor entries are kept as they are (a ``ckptpub/3`` manifest's regions byte
    for byte): a forged manifest changes a header field and keeps the recorded
    identity, as an attacker's edit would. A manifest of an older format keeps its
    version, so its identity and config digests keep their format's rule.
    """
    names = ("identity", "files", "weights", "config", "provenance")
    fields = {name: getattr(manifest, name) for name in names} | changes
    if manifest.version == FORMAT:
        return Manifest.lazy(source=manifest.regions, **fields)
    return Manifest(tensors=manifest.tensors, version=manifest.version, **fields)
