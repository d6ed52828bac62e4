"""What the target is now: the supervisor's reads of manifests, the run index and ``ckptpub verify``.

Everything :mod:`.decide` needs from the disk is read here and handed to it as a
:class:`~.decide.Target` (and, for an identity change, the two manifests), so the
decision stays a pure function of its arguments.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import ckptpub
from ckptpub.errors import and_more, one_line
from ckptpub.signing import TrustedKey, read_trusted_manifest

from . import adapter_runs
from .decide import Held, Stamp, Target

#: Run-index lines that are not records are named, up to this many, then counted.
MAX_SKIPPED_NOTES = 50
#: Why a line was skipped is cut to this many characters: it may quote a hostile line's values.
MAX_NOTE_CHARS = 300


@dataclass
class ManifestCache:
    """Parsed manifests and verify verdicts, keyed by (folder, manifest stamp).

    Polling re-reads nothing that has not been re-published; ``verify`` (a full
    re-hash) runs once per published manifest, not once per poll.
    """

    manifests: dict[tuple[str, Stamp | None], ckptpub.Manifest] = field(default_factory=dict)
    verdicts: dict[tuple[str, Stamp], str | None] = field(default_factory=dict)
    #: Published manifests the supervisor could not use (``reject``), with why: skipped until re-published.
    rejected: dict[tuple[str, Stamp], str] = field(default_factory=dict)
    verify: Callable[[str], Any] = ckptpub.verify

    def reject(self, folder: str, stamp: Stamp, why: str) -> None:
        """Skip ``folder`` as published at ``stamp`` from now on (a new publish is looked at afresh)."""
        if len(self.rejected) > 1024:
            self.rejected.clear()
        self.rejected[(folder, stamp)] = why

    def manifest(self, folder: str, stamp: Stamp | None) -> ckptpub.Manifest:
        """The manifest of ``folder`` as published at ``stamp`` (read once)."""
        key = (folder, stamp)
        if key not in self.manifests:
            if len(self.manifests) > 64:
                self.manifests.clear()
            # With CKPTPUB_PUBLIC_KEY (ckptpub preload --public-key): only what the key signed; a failure
            # is not cached, so a signature that lands after its manifest is seen at the next poll.
            self.manifests[key] = read_trusted_manifest(folder, TrustedKey.from_environment())
        return self.manifests[key]

    def verify_problem(self, folder: str, stamp: Stamp) -> str | None:
        """``None`` when ``ckptpub verify`` passes, else its first problem (cached)."""
        key = (folder, stamp)
        if key not in self.verdicts:
            try:
                report = self.verify(folder)
                self.verdicts[key] = None if report.ok else _first_problem(report)
            except ckptpub.CkptpubError as error:
                self.verdicts[key] = str(error)
        return self.verdicts[key]


def _first_problem(report: Any) -> str:
    problems = list(getattr(report, "problems", ()) or ())
    if not problems:
        return "verify failed"
    first = problems[0]
    parts = (getattr(first, "path", ""), getattr(first, "tensor", None), getattr(first, "detail", ""))
    text = ": ".join(str(part) for part in parts if part) or str(first)
    return and_more(text, len(problems) - 1)


def unusable(error: BaseException) -> str:
    """Why a candidate's manifest cannot be used, from what reading or comparing it raised (one line)."""
    return _cut(one_line(f"its {ckptpub.MANIFEST_NAME} cannot be used ({type(error).__name__}: {error})"))


def _cut(text: str) -> str:
    return text if len(text) <= MAX_NOTE_CHARS else text[: MAX_NOTE_CHARS - 3] + "..."


def manifest_stamp(folder: str) -> Stamp:
    """The folder's manifest :data:`~.decide.Stamp` now: of the path itself, never a symlink's target,
    as the core's readers take it (they follow no symlink in a checkpoint folder)."""
    info = os.lstat(os.path.join(folder, ckptpub.MANIFEST_NAME))
    return (info.st_ino, info.st_mtime_ns, info.st_size)


def observe_folder(
    path: str,
    cache: ManifestCache,
    *,
    verified_only: bool = False,
    step: int | None = None,
    notes: tuple[str, ...] = (),
) -> Target:
    """The target ``path`` as it is now (symlinks resolved: the daemon gets a stable folder)."""
    folder = os.path.realpath(path)
    try:
        stamp = manifest_stamp(folder)
        rejected = cache.rejected.get((folder, stamp))
        if rejected is not None:
            return Target(folder=folder, step=step, error=f"{path}: {rejected}", notes=notes)
        manifest = cache.manifest(folder, stamp)
    except FileNotFoundError:
        kind = "no such folder" if not os.path.isdir(folder) else f"no {ckptpub.MANIFEST_NAME}"
        return Target(folder=folder, step=step, error=f"{path}: {kind}", notes=notes)
    except (OSError, ckptpub.CkptpubError) as error:
        return Target(folder=folder, step=step, error=f"{path}: {error}", notes=notes)
    except Exception as error:  # noqa: BLE001 - whatever one candidate's files make a reader raise: skip it
        return Target(folder=folder, step=step, error=f"{path}: {unusable(error)}", notes=notes)
    if verified_only:
        problem = cache.verify_problem(folder, stamp)
        if problem is not None:
            return Target(
                folder=folder,
                identity=manifest.identity,
                stamp=stamp,
                step=step,
                error=f"{path}: ckptpub verify failed: {problem}",
                notes=notes,
            )
    return Target(folder=folder, identity=manifest.identity, stamp=stamp, step=step, notes=notes)


def observe_run(run_dir: str, cache: ManifestCache, *, verified_only: bool = False) -> Target:
    """The newest usable published step of a training run (``ckptpub-index.jsonl``).

    Candidates are taken newest first (highest step; for equal steps the later
    record); a record whose folder was rotated away, whose manifest is unusable,
    or (with ``verified_only``) that fails ``ckptpub verify`` is skipped and noted.
    Index lines that are not records (``"step": 1e999``, wrong types, an unsafe
    path) are skipped and listed in ``skipped`` (the supervisor warns about each).
    When the newest usable step is an adapter, the target is the base it records
    (``adapter_runs``; ``BaseNotFoundError`` when no folder holds it).
    """
    skips: list[str] = []
    try:
        records = ckptpub.read_run_index(
            run_dir, lambda number, why: skips.append(f"run index line {number} skipped: {_cut(why)}")
        )
    except (OSError, ckptpub.CkptpubError) as error:
        return Target(error=f"{run_dir}: cannot read the run index: {error}")
    skipped = skips[:MAX_SKIPPED_NOTES]
    if len(skips) > MAX_SKIPPED_NOTES:
        skipped[-1] = and_more(skipped[-1], len(skips) - MAX_SKIPPED_NOTES)
    if not records:
        return Target(error=f"{run_dir}: no published step yet", skipped=tuple(skipped))
    notes: list[str] = []
    order = sorted(range(len(records)), key=lambda i: (records[i]["step"], i), reverse=True)
    seen: set[str] = set()
    for i in order:
        record = records[i]
        path = os.path.join(run_dir, *str(record["path"]).split("/"))
        if path in seen:
            continue
        seen.add(path)
        target = observe_folder(path, cache, verified_only=verified_only, step=record["step"])
        if target.error is None:
            if target.identity != record.get("identity"):
                notes.append(
                    f"step {record['step']}: index says {record.get('identity')}, "
                    f"the folder's manifest says {target.identity} (the manifest wins)"
                )
            chosen = replace(target, notes=tuple(notes[-5:]), skipped=tuple(skipped))
            if not adapter_runs.is_adapter_target(chosen, cache.manifest):
                return chosen
            return adapter_runs.base_target(
                run_dir,
                chosen,
                records,
                cache.manifest,
                lambda folder: observe_folder(folder, cache, verified_only=verified_only),
            )
        notes.append(f"skipped step {record['step']}: {target.error}")
    return Target(
        error=f"{run_dir}: no usable published step ({notes[0] if notes else 'none'})",
        notes=tuple(notes[-5:]),
        skipped=tuple(skipped),
    )


def manifests_to_compare(
    held: Held | None, target: Target, cache: ManifestCache
) -> tuple[ckptpub.Manifest | None, ckptpub.Manifest | None]:
    """(held manifest, target manifest) when a live daemon holds another identity, for ``decide`` to explain.

    ``None`` for either one that cannot be read (the held folder rotated away); both
    ``None`` when there is no identity change to explain.
    """
    if held is None or not held.alive or target.error is not None or held.identity == target.identity:
        return None, None
    return _cached(cache, held.folder, held.stamp), _cached(cache, target.folder, target.stamp)


def _cached(cache: ManifestCache, folder: str | None, stamp: Stamp | None) -> ckptpub.Manifest | None:
    if folder is None:
        return None
    try:
        return cache.manifest(folder, stamp)
    except Exception:  # noqa: BLE001 - the held folder's manifest, however broken: nothing to compare
        return None
