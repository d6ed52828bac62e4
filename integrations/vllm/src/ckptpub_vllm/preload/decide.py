"""What the target is, and whether the daemon must be replaced: pure functions.

The rule is one line: **re-preload exactly when the target's identity differs from
the identity the daemon holds.** The identity (``ckptpub.json``'s ``"identity"``)
covers every tensor's name, dtype, shape and bytes and the model config's meaning,
and nothing else, so

* the same model at another path, published again, re-sharded, or with
  ``config.json`` re-formatted keeps its identity: **no re-preload**;
* any changed weight byte or config value changes it: **re-preload**.

Everything here is a function of its arguments (no file, process or clock is
read: :mod:`.observe` reads the target and hands it over), so the supervisor's
choices can be tested without processes and replayed from the decision log.

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

from dataclasses import asdict, dataclass
from typing import Any

import ckptpub

#: ``(inode, mtime_ns, size)`` of a folder's ``ckptpub.json``: changes on every publish (atomic rename).
Stamp = tuple[int, int, int]


@dataclass(frozen=True)
class Target:
    """One observation of the target. ``error`` set means there is no usable target."""

    folder: str | None = None  # real path (symlinks resolved) the daemon is given
    identity: str | None = None
    stamp: Stamp | None = None
    step: int | None = None
    error: str | None = None
    notes: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # run-index lines that are not records (observe.MAX_SKIPPED_NOTES at most)

    def fingerprint(self) -> tuple[object, ...]:
        """Changes whenever anything a person would call a new publish event changed."""
        return (self.folder, self.identity, self.stamp, self.step, self.error)

    def to_json(self) -> dict[str, Any]:
        """The observation as ``status.json`` and the decision log record it (empty fields left out)."""
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
    stamp: Stamp | None
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
    """What to do (``action``), its ``why`` code (the table above) and the ``reason`` in words."""

    action: str  # start | replace | restart | keep | wait
    why: str
    reason: str

    @property
    def preloads(self) -> bool:
        """Whether acting on it starts a daemon."""
        return self.action in ("start", "replace", "restart")


def explain_change(
    held_manifest: ckptpub.Manifest | None, target_manifest: ckptpub.Manifest | None
) -> tuple[str, str]:
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
    held_manifest: ckptpub.Manifest | None = None,
    target_manifest: ckptpub.Manifest | None = None,
) -> Decision:
    """What to do now, given what is held, what the target is, and the last observation.

    ``held_manifest`` and ``target_manifest`` (``observe.manifests_to_compare``) only
    explain an identity change; the decision itself looks at identities.
    """
    if target.error is not None:
        kept = f"; keeping the daemon holding {held.identity}" if held and held.alive else ""
        return Decision("keep" if held else "wait", "target-unusable", f"{target.error}{kept}")

    short = _short(target.identity)
    where = f"{target.folder}" + (f" (step {target.step})" if target.step is not None else "")
    failed = failure if failure is not None and failure.identity == target.identity else None
    if failed is not None and now < failed.retry_at:
        return Decision(
            "wait",
            "backoff",
            f"{short} failed {failed.count} time(s) in a row ({failed.error}); "
            f"next try in {max(0.0, failed.retry_at - now):.0f}s",
        )
    if failed is not None and (held is None or (held.alive and held.identity != target.identity)):
        action = "replace" if held else "start"
        return Decision(
            action,
            "retry",
            f"retrying the preload of {short} from {where} after {failed.count} failure(s) ({failed.error})",
        )

    if held is None:
        return Decision("start", "first-preload", f"no daemon held; preloading {short} from {where}")

    if not held.alive:
        code = f" (exit code {held.exit_code})" if held.exit_code is not None else ""
        if held.identity == target.identity:
            return Decision(
                "restart",
                "daemon-died",
                f"daemon pid {held.pid} holding {short} exited{code}; "
                f"restarting the same identity from {where}",
            )
        return Decision(
            "start",
            "daemon-died-new-target",
            f"daemon pid {held.pid} holding {_short(held.identity)} exited{code}; "
            f"the target is now {short} at {where}",
        )

    if held.identity != target.identity:
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
