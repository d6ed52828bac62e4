"""``--follow`` on a run of adapters: the daemon holds the base the adapters apply on, never an adapter.

A PEFT LoRA run saves adapters (``adapter_model.safetensors``, ``adapter_config.json``)
whose manifests record the identity of the base they were trained on
(``provenance.base_identity``). The weight-cache daemon holds base models (engines
apply adapters themselves), so for such a run the target is that base, found:

1. in the run index: a record with the base's identity (a base published into the run);
2. in the adapters' ``adapter_config.json``: ``base_model_name_or_path``, the folder the
   training job loaded the base from (as given, or relative to the adapter's or the run's
   folder), newest adapter first;

and accepted only when the folder's own manifest has exactly the recorded identity (so
a path in a config file, which anyone can edit, can point at nothing else). When no
folder holds it, the supervisor stops with one line naming the identity to preload.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import ckptpub
from ckptpub.integration import base_of, is_adapter, jsonfiles

from .decide import Target

ADAPTER_CONFIG = "adapter_config.json"
#: Adapters whose ``adapter_config.json`` is read per poll: the newest usable one and a few before it.
MAX_ADAPTERS_READ = 4
#: ``adapter_config.json`` is a few hundred bytes; anything this large is not one.
MAX_CONFIG_BYTES = 1 << 20


class BaseNotFoundError(ckptpub.CkptpubError):
    """An adapter run whose base no folder holds: only the operator can say where that identity is."""


def is_adapter_target(target: Target, manifest_of: Callable[[str, Any], ckptpub.Manifest]) -> bool:
    return target.folder is not None and is_adapter(manifest_of(target.folder, target.stamp))


def base_target(
    run_dir: str,
    adapter: Target,
    records: Sequence[dict[str, Any]],
    manifest_of: Callable[[str, Any], ckptpub.Manifest],
    observe: Callable[[str], Target],
) -> Target:
    """The target for a run whose newest usable step is ``adapter``: its base, observed like a model folder.

    ``manifest_of(folder, stamp)`` reads a manifest (cached), ``observe(folder)`` observes
    a folder as a target. Raises :class:`BaseNotFoundError` when no folder holds the base.
    """
    assert adapter.folder is not None
    manifest = manifest_of(adapter.folder, adapter.stamp)
    base = base_of(manifest)
    step = f"step {adapter.step}" if adapter.step is not None else adapter.folder
    if base is None:
        raise BaseNotFoundError(
            f"{run_dir} is an adapter run and its {step} records no base identity: the daemon holds a base, "
            f"not an adapter; preload the base with `ckptpub preload BASE_DIR`"
        )
    looked: list[str] = []
    for folder in _candidates(run_dir, adapter.folder, records, base):
        looked.append(folder)
        target = observe(folder)
        if target.error is None and target.identity == base and not is_adapter_target(target, manifest_of):
            note = f"{step} is an adapter on base {base}: preloading the base from {target.folder}"
            return Target(
                folder=target.folder,
                identity=target.identity,
                stamp=target.stamp,
                step=adapter.step,
                notes=(*adapter.notes, note),
                skipped=adapter.skipped,
            )
    where = f" (looked at {', '.join(looked)})" if looked else ""
    raise BaseNotFoundError(
        f"{run_dir} is an adapter run: its adapters apply on base {base}, and no folder with that identity "
        f"was found{where}; preload that base with `ckptpub preload BASE_DIR`"
    )


def _candidates(run_dir: str, adapter_folder: str, records: Sequence[dict[str, Any]], base: str) -> list[str]:
    """Folders that may hold the base, in the order of the module docstring, each once."""
    folders = [os.path.join(run_dir, *str(r["path"]).split("/")) for r in reversed(records)]
    found = [f for f, r in zip(folders, reversed(records), strict=True) if r.get("identity") == base]
    for folder in list(dict.fromkeys([adapter_folder, *folders]))[:MAX_ADAPTERS_READ]:
        named = _base_path(folder)
        if named is not None:
            relative = [os.path.join(folder, named), os.path.join(run_dir, named)]
            found += [named] if os.path.isabs(named) else relative
    unique: list[str] = []
    for folder in found:
        real = os.path.realpath(folder)
        if real not in unique and os.path.isdir(real):
            unique.append(real)
    return unique


def _base_path(adapter_folder: str) -> str | None:
    """``base_model_name_or_path`` of an adapter folder's ``adapter_config.json``, when it has one."""
    try:
        path = os.path.join(adapter_folder, ADAPTER_CONFIG)
        config = jsonfiles.read_json(path, MAX_CONFIG_BYTES, ADAPTER_CONFIG)
    except ckptpub.CkptpubError:
        return None
    named = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    return named if isinstance(named, str) and named and "\0" not in named else None
