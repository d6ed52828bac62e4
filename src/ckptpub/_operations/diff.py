"""Diff two manifests: which model tensors and configs differ, and (``explain``) what that means.

``diff_manifests`` reads no tensor data: the manifests' digests say what differs. It
returns data (``ManifestDiff``); a difference is a result, never an exception.
"""

from __future__ import annotations

import os
from itertools import compress
from operator import ne
from typing import NamedTuple

from .._filesystem.scan import as_path
from .._format.manifest import Manifest
from .._format.records import Columns, model_entries
from ..errors import CkptpubError
from .explain import (
    ConfigChange,
    TensorChange,
    TensorGroup,
    compare_configs,
    group_tensors,
    relation,
    tensor_change,
)


class ManifestDiff(NamedTuple):
    """Model tensors whose bytes, dtype or shape differ (``changed``), or that only one side has.

    The rest explains the difference (see ``explain``): ``tensor_changes`` says what
    differs in each changed tensor, ``groups`` names changed, added and removed
    tensors by pattern ("self_attn.{q,v}_proj.weight in layers 0-27"),
    ``config_changed`` the config files whose meaning differs (``explain.compare_configs``),
    ``config_keys`` the config keys whose values differ, each marked with whether the
    identity counts it (read from the folders' files when both were given as folders;
    ``config_notes`` says why not otherwise),
    and ``relation`` how the two are linked by their recorded base
    (``explain.relation``: ``adapter_on_a``, ``from_a``, ``same_base``, ... or None).
    """

    identity_a: str
    identity_b: str
    changed: tuple[str, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]
    config_changed: tuple[str, ...]
    tensor_changes: tuple[TensorChange, ...] = ()
    groups: tuple[TensorGroup, ...] = ()
    config_keys: tuple[ConfigChange, ...] = ()
    config_notes: tuple[str, ...] = ()
    relation: str | None = None

    @property
    def same(self) -> bool:
        """One identity: one model."""
        return self.identity_a == self.identity_b


def diff_manifests(
    a: Manifest,
    b: Manifest,
    *,
    folder_a: str | os.PathLike[str] | None = None,
    folder_b: str | os.PathLike[str] | None = None,
) -> ManifestDiff:
    """Compare the model tensors and configs of two manifests; no tensor data is read.

    With ``folder_a`` and ``folder_b`` (the checkpoint folders the manifests came
    from), config files whose digests differ are read there, if they still have
    those digests, to name the keys that changed.
    """
    for name, value in (("a", a), ("b", b)):
        if not isinstance(value, Manifest):
            raise CkptpubError(
                f"diff_manifests: {name} must be a Manifest (see read_manifest), got {type(value).__name__}"
            )
    changes, added, removed = _tensor_differences(_model_tensors(a), _model_tensors(b))
    changed = [change.name for change in changes]
    configs = compare_configs(
        a, b, *(None if f is None else as_path(f, "folder") for f in (folder_a, folder_b))
    )
    groups = (
        group_tensors("changed", [(c.name, c.what) for c in changes])
        + group_tensors("added", added)
        + group_tensors("removed", removed)
    )
    return ManifestDiff(
        identity_a=a.identity,
        identity_b=b.identity,
        changed=tuple(changed),
        added=tuple(name for name, _ in added),
        removed=tuple(name for name, _ in removed),
        config_changed=configs.changed,
        tensor_changes=changes,
        groups=groups,
        config_keys=configs.keys,
        config_notes=configs.notes,
        relation=relation(a, b),
    )


def _model_tensors(manifest: Manifest) -> Columns:
    """Model tensors sorted by name; for a folder without weight files, every tensor by ``file:name``."""
    if manifest.weights:
        return manifest.decoded().model
    tensors = sorted((f"{t.file}:{t.name}", t.dtype, t.shape, t.digest[-64:]) for t in manifest.tensors)
    return Columns(*map(list, zip(*tensors, strict=True))) if tensors else Columns([], [], [], [])


def _tensor_differences(
    a: Columns, b: Columns
) -> tuple[tuple[TensorChange, ...], list[tuple[str, str]], list[tuple[str, str]]]:
    """Each changed tensor's change, and the added and removed tensors' names and dtypes.

    Two steps of one run list the same tensors: their columns are compared row by
    row, in C, which at 100k tensors is far cheaper than a lookup by name per tensor.
    """
    if a.names == b.names:
        rows_a = zip(a.dtypes, a.shapes, a.hexes, strict=True)
        different = map(ne, rows_a, zip(b.dtypes, b.shapes, b.hexes, strict=True))
        rows = compress(range(len(a.names)), different)
        return tuple(tensor_change(a.names[row], a.entry(row), b.entry(row)) for row in rows), [], []
    entries_a, entries_b = model_entries(a), model_entries(b)
    changed = sorted(n for n in entries_a.keys() & entries_b.keys() if entries_a[n] != entries_b[n])
    added = [(n, entries_b[n].dtype) for n in sorted(entries_b.keys() - entries_a.keys())]
    removed = [(n, entries_a[n].dtype) for n in sorted(entries_a.keys() - entries_b.keys())]
    return tuple(tensor_change(n, entries_a[n], entries_b[n]) for n in changed), added, removed
