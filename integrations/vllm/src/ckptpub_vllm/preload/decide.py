"""What the target is, and whether the daemon must be replaced: pure functions.

The rule is one line: **re-preload exactly when the target's identity differs from
the identity the daemon holds.** The identity (``ckptpub.json``'s ``"identity"``)
covers every tensor's name, dtype, shape and bytes and the model config's meaning,
and nothing else, so

* the same model at another path, published again, re-sharded, or with
  ``config.json`` re-formatted keeps its identity: **no re-preload**;
* any changed weight byte or config value changes it: **re-preload**.

Everything here is a function of its arguments (plus, for the observers, the
manifest files they read), so the supervisor's choices can be tested without
processes and replayed from the decision log.

``why`` codes used in decisions (the decision log's ``why`` field):

==========================  =========  ==============================================
why                         action     when
==========================  =========  ==============================================
``first-preload``           start      nothing held yet
``weights-changed``         replace    identity differs; tensors differ
``config-changed``          replace    identity differs; only the config differs
``weights-and-config``      replace    identity differs; both differ
``identity-changed``        replace    identity differs; the held manifest is gone
``daemon-died``             restart    the daemon exited; same identity started again
``daemon-died-new-target``  start      the daemon exited and the target changed
``retry``                   start...   a failed preload is tried again after back-off
``same-identity-republished`` keep     the same folder's manifest was written again
``same-identity-new-path``  keep       the target moved to another folder, same model
``same-identity``           keep       something observed changed, the identity did not
``target-unusable``         keep       no usable target (held daemon, if any, kept)
``backoff``                 wait       a preload of this identity failed recently
==========================  =========  ==============================================
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import ckptpub

from ..signature import read_trusted_manifest


@dataclass(frozen=True)
class Target:
    """One observation of the target. ``error`` set means there is no usable target."""

    folder: str | None = None  # real path (symlinks resolved) the daemon is given
    identity: str | None = None
    stamp: tuple[int, int, int] | None = None  # (inode, mtime_ns, size) of ckptpub.json
    step: int | None = None
    error: str | None = None
    notes: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # run-index lines that are not records (the first MAX_SKIPPED_NOTES)

    def fingerprint(self) -> tuple:
        """Changes whenever anything a person would call a new publish event changed."""
        return (self.folder, self.identity, self.stamp, self.step, self.error)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["stamp"] = list(self.stamp) if self.stamp else None
        data["notes"] = list(self.notes)
        data["skipped"] = list(self.skipped)
        return {k: v for k, v in data.items() if v not in (None, [], ())}


@dataclass
class Held:
    """The daemon that holds weights now."""

    identity: str
    folder: str
    stamp: tuple[int, int, int] | None
    pid: int
    since: float
    alive: bool = True
    exit_code: int | None = None


@dataclass(frozen=True)
class Failure:
    """A preload of ``identity`` failed ``count`` times in a row; try again at ``retry_at``."""

    identity: str
    count: int
    retry_at: float
    error: str


@dataclass(frozen=True)
class Decision:
    action: str  # start | replace | restart | keep | wait
    why: str
    reason: str

    @property
    def preloads(self) -> bool:
        return self.action in ("start", "replace", "restart")


# ---------------------------------------------------------------------------
# Observing the target

#: Run-index lines that are not records are named, up to this many, then counted.
MAX_SKIPPED_NOTES = 50


@dataclass
class ManifestCache:
    """Parsed manifests and verify verdicts, keyed by (folder, manifest stamp).

    Polling re-reads nothing that has not been re-published; ``verify`` (a full
    re-hash) runs once per published manifest, not once per poll.
    """

    manifests: dict[tuple, Any] = field(default_factory=dict)
    verdicts: dict[tuple, str | None] = field(default_factory=dict)
    verify: Callable[[str], Any] = ckptpub.verify

    def manifest(self, folder: str, stamp: tuple) -> Any:
        key = (folder, stamp)
        if key not in self.manifests:
            if len(self.manifests) > 64:
                self.manifests.clear()
            # With CKPTPUB_PUBLIC_KEY (ckptpub preload --public-key): only what the key signed; a failure
            # is not cached, so a signature that lands after its manifest is seen at the next poll.
            self.manifests[key] = read_trusted_manifest(folder)
        return self.manifests[key]

    def verify_problem(self, folder: str, stamp: tuple) -> str | None:
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
    return text + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")


def manifest_stamp(folder: str) -> tuple[int, int, int]:
    """``(inode, mtime_ns, size)`` of the folder's manifest: changes on every publish (atomic rename)."""
    info = os.stat(os.path.join(folder, ckptpub.MANIFEST_NAME))
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
        manifest = cache.manifest(folder, stamp)
    except FileNotFoundError:
        kind = "no such folder" if not os.path.isdir(folder) else f"no {ckptpub.MANIFEST_NAME}"
        return Target(folder=folder, step=step, error=f"{path}: {kind}", notes=notes)
    except (OSError, ckptpub.CkptpubError) as error:
        return Target(folder=folder, step=step, error=f"{path}: {error}", notes=notes)
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
    """
    skipped: list[str] = []

    def skip(number: int, why: str) -> None:
        if len(skipped) < MAX_SKIPPED_NOTES:
            skipped.append(f"run index line {number} skipped: {why}")
        elif len(skipped) == MAX_SKIPPED_NOTES:
            skipped.append("more run index lines skipped (not listed)")

    try:
        records = ckptpub.read_run_index(run_dir, skip)
    except (OSError, ckptpub.CkptpubError) as error:
        return Target(error=f"{run_dir}: cannot read the run index: {error}")
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
            return Target(
                folder=target.folder,
                identity=target.identity,
                stamp=target.stamp,
                step=target.step,
                notes=tuple(notes[-5:]),
                skipped=tuple(skipped),
            )
        notes.append(f"skipped step {record['step']}: {target.error}")
    return Target(
        error=f"{run_dir}: no usable published step ({notes[0] if notes else 'none'})",
        notes=tuple(notes[-5:]),
        skipped=tuple(skipped),
    )


# ---------------------------------------------------------------------------
# Deciding


def explain_change(held_manifest: Any | None, target_manifest: Any | None) -> tuple[str, str]:
    """(why, human text) for two different identities, from the manifests alone."""
    if held_manifest is None or target_manifest is None:
        return "identity-changed", "the held checkpoint's manifest is not available to compare"
    diff = ckptpub.diff_manifests(held_manifest, target_manifest)
    tensors = len(diff.changed) + len(diff.added) + len(diff.removed)
    parts = []
    if diff.changed:
        parts.append(f"{len(diff.changed)} tensor(s) changed (first: {diff.changed[0]})")
    if diff.added:
        parts.append(f"{len(diff.added)} added")
    if diff.removed:
        parts.append(f"{len(diff.removed)} removed")
    if diff.config_changed:
        parts.append(f"config differs ({', '.join(diff.config_changed)})")
    if tensors and diff.config_changed:
        why = "weights-and-config"
    elif tensors:
        why = "weights-changed"
    elif diff.config_changed:
        why = "config-changed"
    else:
        why = "identity-changed"
    return why, "; ".join(parts) or "identities differ"


def decide(
    held: Held | None,
    target: Target,
    *,
    previous: Target | None = None,
    failure: Failure | None = None,
    now: float = 0.0,
    manifests: Callable[[str, Any], Any] | None = None,
) -> Decision:
    """What to do now, given what is held, what the target is, and the last observation.

    ``manifests(folder, stamp)`` returns a parsed manifest (or ``None``) and is used
    only to explain an identity change; the decision itself looks at identities.
    """
    if target.error is not None:
        kept = f"; keeping the daemon holding {held.identity}" if held and held.alive else ""
        return Decision("keep" if held else "wait", "target-unusable", f"{target.error}{kept}")

    short = _short(target.identity)
    where = f"{target.folder}" + (f" (step {target.step})" if target.step is not None else "")
    failed = failure is not None and failure.identity == target.identity
    if failed and now < failure.retry_at:
        return Decision(
            "wait",
            "backoff",
            f"{short} failed {failure.count} time(s) in a row ({failure.error}); "
            f"next try in {max(0.0, failure.retry_at - now):.0f}s",
        )
    if failed and (held is None or (held.alive and held.identity != target.identity)):
        action = "replace" if held else "start"
        return Decision(
            action,
            "retry",
            f"retrying the preload of {short} from {where} "
            f"after {failure.count} failure(s) ({failure.error})",
        )

    if held is None:
        return Decision("start", "first-preload", f"no daemon held; preloading {short} from {where}")

    if not held.alive:
        code = f" (exit code {held.exit_code})" if held.exit_code is not None else ""
        if held.identity == target.identity:
            return Decision(
                "restart",
                "daemon-died",
                f"daemon pid {held.pid} holding {short} exited{code}; restarting the same identity from {where}",
            )
        return Decision(
            "start",
            "daemon-died-new-target",
            f"daemon pid {held.pid} holding {_short(held.identity)} exited{code}; "
            f"the target is now {short} at {where}",
        )

    if held.identity != target.identity:
        held_manifest = target_manifest = None
        if manifests is not None:
            held_manifest = manifests(held.folder, held.stamp)
            target_manifest = manifests(target.folder, target.stamp)
        why, detail = explain_change(held_manifest, target_manifest)
        return Decision("replace", why, f"identity {_short(held.identity)} -> {short} at {where}: {detail}")

    # Same identity: never re-preload. Say which kind of "same" this was.
    if previous is not None and previous.folder == target.folder and previous.stamp != target.stamp:
        return Decision(
            "keep",
            "same-identity-republished",
            f"{where} was published again with the same identity {short}: no re-preload",
        )
    if target.folder != held.folder:
        return Decision(
            "keep",
            "same-identity-new-path",
            f"{where} has the held identity {short} (daemon loaded it from {held.folder}): no re-preload",
        )
    if target.stamp != held.stamp:
        return Decision(
            "keep",
            "same-identity-republished",
            f"{where} was published again since the daemon loaded it, same identity {short}: no re-preload",
        )
    return Decision("keep", "same-identity", f"target unchanged: {short} at {where}")


def _short(identity: str | None) -> str:
    if not identity:
        return "?"
    return identity[:19] if identity.startswith("blake3:") else identity[:16]
