"""A manifest with some fields replaced: how tests forge a manifest or compare two less their provenance."""

from __future__ import annotations

from typing import Any

from ckptpub import Manifest


def replaced(manifest: Manifest, **changes: Any) -> Manifest:
    """A copy of ``manifest`` with ``changes`` (any of identity, files, weights, config, provenance).

    The tensor entries are kept as they are (its regions byte for byte): a forged
    manifest changes a header field and keeps the recorded identity, as an
    attacker's edit would.
    """
    names = ("identity", "files", "weights", "config", "provenance")
    fields = {name: getattr(manifest, name) for name in names} | changes
    return Manifest.lazy(source=manifest.regions, **fields)
