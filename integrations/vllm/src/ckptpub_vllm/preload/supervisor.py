"""The supervisor loop: observe the target, decide, act, record. A small state machine.

States (``status.json``'s ``state``):

* ``starting``: the supervisor is up and has not decided yet;
* ``loading``: a daemon is being loaded and is not confirmed yet;
* ``ready``: a confirmed daemon holds exactly the target's identity;
* ``failed``: the last preload failed (``last_error`` says why). In overlap mode
  the previous daemon, if any, still holds its (older) identity and ``held`` says
  so; engines asking for the new identity get a key mismatch from it, never its
  weights. The preload is retried with exponential back-off;
* ``no-target``: there is no usable target (``target.error``); a held daemon is kept;
* ``degraded``: the daemon exited and is waiting out a restart back-off;
* ``stopped``: the supervisor stopped (``SIGTERM``/``SIGINT``) and stopped its daemon.

Replacement. Default (overlap): every daemon serves vLLM's default socket path (or
``--socket-dir``), the one engines use when they are given no socket option. The new
daemon loads while the old one keeps serving; once loaded, verified and warmed up it
reports ``waiting`` for the path (``daemon_serving``), the supervisor asks the old one
to hand the path over, the new one takes it and reports READY, and is recorded as
held. The old daemon is *retired*: it serves no new engine but keeps its weights,
which engines in ``zero_copy`` mode map, and is stopped once no engine it handed its
weights to is still running. With ``--one-at-a-time`` the old daemon is handed over
and stopped (once its engines are gone) before the new one loads.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from types import FrameType
from typing import Any

from ckptpub import CkptpubError
from ckptpub.errors import one_line

from . import adapter_runs, schema
from . import status as st
from .daemon_process import DEFAULT_COMMAND, READY_PATTERN, Daemon, build_argv
from .decide import Decision, Failure, Held, Target, decide
from .observe import (
    ManifestCache,
    manifests_to_compare,
    observe_folder,
    observe_run,
    unusable,
)

#: A daemon that ran at least this long after READY is "healthy": its death restarts at once.
HEALTHY_S = 60.0
#: How long a daemon asked to hand its socket path over may take before the new one is given up.
HAND_OVER_TIMEOUT_S = 30.0


class State(str, Enum):
    """The supervisor's state, as ``status.json`` writes it (see the module docstring)."""

    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    NO_TARGET = "no-target"
    DEGRADED = "degraded"
    STOPPED = "stopped"


@dataclass
class Config:
    model_dir: str | None = None
    follow: str | None = None
    verified_only: bool = False
    daemon_cmd: str = DEFAULT_COMMAND
    extra: list[str] = field(default_factory=list)
    state_dir: str = ""
    interval: float = 5.0
    one_at_a_time: bool = False
    socket_dir: str | None = None
    ready_timeout: float = 1800.0
    stop_timeout: float = 60.0
    retry_delay: float = 30.0
    max_retry_delay: float = 600.0
    ready_pattern: str = READY_PATTERN
    quiet: bool = False

    @property
    def overlap(self) -> bool:
        return not self.one_at_a_time


class Supervisor:
    """Keeps one daemon holding the target's identity; :meth:`run` until ``SIGTERM``/``SIGINT``."""

    def __init__(self, config: Config) -> None:
        self.cfg = config
        self.state_dir = os.path.abspath(config.state_dir)
        self.ready_re = re.compile(config.ready_pattern)
        self.cache = ManifestCache()
        self.stop_event = threading.Event()
        self.lock = st.SupervisorLock(self.state_dir)
        self.held: Daemon | None = None
        self.held_dead = False
        self.loading: Daemon | None = None
        #: Replaced daemons kept (no socket path) for engines still mapping their weights.
        self.retired: list[Daemon] = []
        self._kept_for: dict[int, list[int]] = {}  # retired daemon pid -> engine pids last named
        self.previous: Target | None = None
        self.target: Target | None = None
        self.failure: Failure | None = None
        self.generation = 0
        self.state = State.STARTING
        self.last_decision: dict[str, Any] | None = None
        self.last_logged: tuple[str, str] | None = None
        self.last_error: str | None = None

    # ---------------------------------------------------------------- state

    def _move_to(self, state: State) -> None:
        """The one place the state changes. Nothing leaves ``stopped``: the supervisor is done then."""
        if self.state is State.STOPPED and state is not State.STOPPED:
            raise RuntimeError(f"supervisor state {state.value} after stopped")
        self.state = state

    # ------------------------------------------------------------------ run

    def run(self) -> int:
        st.prepare(self.state_dir)
        self.lock.acquire()
        previous_handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._outcome(
                "info", "supervisor-start", f"supervisor pid {os.getpid()} started: {self._describe()}"
            )
            try:
                self._recover()
                self._write_status()
                while not self.stop_event.is_set():
                    self.step()
                    self.stop_event.wait(self.cfg.interval)
            except BaseException as error:  # any fatal path stops our daemons first: never orphan one
                self._shutdown(f"supervisor stopping on an error ({type(error).__name__}: {error})")
                raise
            self._shutdown("supervisor stopping on signal")
            return 0
        finally:
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)
            self.lock.release()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop_event.set()

    def _describe(self) -> str:
        what = f"--follow {self.cfg.follow}" if self.cfg.follow else self.cfg.model_dir
        mode = "overlap" if self.cfg.overlap else "one-at-a-time"
        verified = ", verified only" if self.cfg.verified_only else ""
        return f"target {what} ({mode}{verified}), daemon command: {self.cfg.daemon_cmd}"

    # ------------------------------------------------------------ observing

    def observe(self) -> Target:
        if self.cfg.follow:
            return observe_run(self.cfg.follow, self.cache, verified_only=self.cfg.verified_only)
        target = observe_folder(self.cfg.model_dir or "", self.cache, verified_only=self.cfg.verified_only)
        if target.error is None and adapter_runs.is_adapter_target(target, self.cache.manifest):
            error = f"{self.cfg.model_dir}: an adapter, which engines apply on a base model; not preloaded"
            return Target(folder=target.folder, error=error)
        return target

    def held_view(self) -> Held | None:
        d = self.held
        if d is None:
            return None
        return Held(
            identity=d.identity,
            folder=d.folder,
            stamp=(d.stamp[0], d.stamp[1], d.stamp[2]) if d.stamp and len(d.stamp) == 3 else None,
            pid=d.pid,
            since=d.ready_at or d.since,
            alive=not self.held_dead,
            exit_code=d.exit_code,
        )

    # ----------------------------------------------------------------- step

    def step(self) -> Decision:
        """One round: notice a dead daemon, observe the target, decide, act, record."""
        now = time.time()
        self._drain_retired()
        if self.held is not None and not self.held_dead:
            if self.held.alive():
                self.held.watch.poll()  # engines it hands weights to
            else:
                self._held_died(now)
        target = self.observe()
        seen = set(self.previous.skipped) if self.previous is not None else set()
        for note in target.skipped:
            if note not in seen:
                self._outcome("info", "warning", f"{self.cfg.follow}: {note}")
        held = self.held_view()
        decision = None
        while decision is None:
            try:
                held_manifest, target_manifest = manifests_to_compare(held, target, self.cache)
                decision = decide(
                    held,
                    target,
                    previous=self.previous,
                    failure=self.failure,
                    now=now,
                    held_manifest=held_manifest,
                    target_manifest=target_manifest,
                )
            except Exception as error:  # noqa: BLE001 - one candidate, however broken, never stops the supervisor
                if target.folder is None or target.stamp is None:
                    raise
                self._skip(target, error)
                target = self.observe()
        changed = self.previous is None or target.fingerprint() != self.previous.fingerprint()
        key = (decision.action, decision.why)
        if changed or decision.preloads or (decision.action == "wait" and key != self.last_logged):
            self._log_decision(decision, target)
        self.previous = target
        self.target = target
        if decision.preloads:
            self._preload(target, decision)
        else:
            self._settle_state(decision)
            self._write_status()
        return decision

    def _skip(self, target: Target, error: Exception) -> None:
        """Skip a candidate whose manifest made the decision fail (one warning naming it); keep the daemon."""
        assert target.folder is not None
        assert target.stamp is not None
        why = unusable(error)
        self.cache.reject(target.folder, target.stamp, why)
        step = f" (step {target.step})" if target.step is not None else ""
        self._outcome("info", "warning", f"skipped {target.folder}{step}: {why}")

    def _settle_state(self, decision: Decision) -> None:
        if decision.why == "target-unusable":
            self._move_to(State.NO_TARGET)
        elif decision.why == "backoff":
            self._move_to(State.DEGRADED if self.held_dead else State.FAILED)
        elif (
            self.held is not None
            and not self.held_dead
            and self.target
            and self.held.identity == self.target.identity
        ):
            self._move_to(State.READY)

    def _held_died(self, now: float) -> None:
        d = self.held
        assert d is not None
        self.held_dead = True
        d.watch.poll()
        uptime = now - (d.ready_at or d.since)
        code = f" with code {d.exit_code}" if d.exit_code is not None else ""
        error = f"daemon pid {d.pid} exited{code} after {uptime:.0f}s: {d.watch.last_line()}"
        self.last_error = error
        count = 1
        if self.failure is not None and self.failure.identity == d.identity and uptime < HEALTHY_S:
            count = self.failure.count + 1
        delay = 0.0 if count == 1 else self._backoff(count - 1)
        self.failure = Failure(d.identity, count, now + delay, f"daemon exited{code}")
        self._move_to(State.DEGRADED)
        self._outcome("exited", "daemon-exited", error, held=d)
        st.remove(os.path.join(self.state_dir, st.DAEMON))

    def _backoff(self, count: int) -> float:
        return min(self.cfg.max_retry_delay, self.cfg.retry_delay * 2.0 ** max(0, count - 1))

    # -------------------------------------------------------------- preload

    def _preload(self, target: Target, decision: Decision) -> None:
        assert target.identity is not None
        assert target.folder is not None
        self.generation += 1
        gen = self.generation
        old = self.held
        if old is not None and (self.held_dead or not self.cfg.overlap):
            if not self.held_dead:
                self._outcome(
                    "stopping",
                    "stopping-old",
                    f"one at a time: retiring daemon pid {old.pid} ({old.identity}) before loading "
                    f"{target.identity}",
                    held=old,
                )
                retiring, self.held, old = old, None, None
                retiring.hand_over()
                self._retire(retiring)
                self._forget()
                if not self._wait_retired_gone(retiring):
                    return
            else:
                old.stop(self.cfg.stop_timeout)
                self._forget()
            self.held, self.held_dead, old = None, False, None
        try:
            argv = build_argv(
                self.cfg.daemon_cmd,
                self.cfg.extra,
                folder=target.folder,
                socket_dir=self.cfg.socket_dir,
                identity=target.identity,
            )
        except ValueError as error:
            raise CkptpubError(str(error)) from None
        log_path = st.log_path(self.state_dir, gen)
        try:
            new = Daemon.launch(
                generation=gen,
                identity=target.identity,
                folder=target.folder,
                stamp=target.stamp,
                argv=argv,
                log_path=log_path,
                socket_dir=self.cfg.socket_dir,
                ready_re=self.ready_re,
                takeover=self.cfg.overlap,
            )
        except OSError as error:  # not a transient failure: the same command fails the same way every time
            raise CkptpubError(
                f"cannot start the daemon command {argv[0]!r}: {error.strerror or error}"
            ) from None
        self.loading = new
        self._move_to(State.LOADING)
        st.write_json(os.path.join(self.state_dir, st.LOADING), new.record())
        self._outcome(
            "loading",
            "launched",
            f"daemon pid {new.pid} loading {target.identity} from {target.folder} (log {log_path})",
            held=new,
        )
        self._write_status()
        verdict, detail = self._wait_ready(new, old)
        self.loading = None
        if verdict != "ready":
            how = new.stop(self.cfg.stop_timeout)
            st.remove(os.path.join(self.state_dir, st.LOADING))
            if old is not None:
                old.watch.poll()
            if old is not None and old.watch.handed_over:  # it no longer serves: it can only be drained
                self._retire(old)
                self._forget()
                self.held = None
            if verdict == "interrupted":
                self._outcome(
                    "stopped",
                    "interrupted",
                    f"stop requested while loading; daemon pid {new.pid} {how}",
                    held=new,
                )
                return
            if verdict == "permanent":
                self._outcome("failed", "permanent", f"preload of {target.identity} failed: {detail}")
                raise CkptpubError(f"daemon pid {new.pid} cannot succeed on retry: {detail}")
            self._failed(target, detail)
            return
        # Confirmed: it is the daemon now. Record it before touching the old one.
        self.held, self.held_dead = new, False
        st.write_json(os.path.join(self.state_dir, st.DAEMON), new.record())
        st.remove(os.path.join(self.state_dir, st.LOADING))
        self.failure = None
        self.last_error = None
        took = (new.ready_at or time.time()) - new.since
        self._outcome("ready", "ready", f"{detail} after {took:.1f}s; folder {new.folder}", held=new)
        if old is not None:
            if not old.handed_over():
                old.hand_over(taken_by=new)
            self._retire(old)
            self._drain_retired()
        self._move_to(State.READY)
        self._write_status()

    def _wait_ready(self, daemon: Daemon, old: Daemon | None) -> tuple[str, str]:
        """Follow a new daemon until it is ready or failed; when it waits for ``old``'s path, hand it over."""
        deadline = time.monotonic() + self.cfg.ready_timeout
        next_status = time.monotonic() + 5
        asked_at: float | None = None
        while True:
            verdict, detail = daemon.check()
            if verdict == "waiting":
                if asked_at is None:
                    problem = self._hand_over_to(daemon, old)
                    if problem is not None:
                        return "failed", problem
                    asked_at = time.monotonic()
                elif (
                    old is not None
                    and not old.handed_over()
                    and time.monotonic() > asked_at + HAND_OVER_TIMEOUT_S
                ):
                    return "failed", (
                        f"daemon pid {old.pid} did not hand over {', '.join(old.watch.sockets())} within "
                        f"{HAND_OVER_TIMEOUT_S:.0f}s; it keeps serving {old.identity}"
                    )
            elif verdict != "loading":
                return verdict, detail
            if self.stop_event.is_set():
                return "interrupted", "stop requested"
            if time.monotonic() > deadline:
                return "failed", (
                    f"daemon pid {daemon.pid} was not ready after {self.cfg.ready_timeout:.0f}s: "
                    f"{daemon.watch.last_line()}"
                )
            if time.monotonic() > next_status:
                self._write_status()
                next_status = time.monotonic() + 5
            self.stop_event.wait(0.05)

    def _hand_over_to(self, new: Daemon, old: Daemon | None) -> str | None:
        """Ask ``old`` to hand its socket path(s) over to ``new``, which waits for them; else say why not."""
        wanted = set(new.watch.waiting.values())
        held = set(old.watch.sockets()) if old is not None and not self.held_dead else set()
        if not wanted <= held:
            others = ", ".join(sorted(wanted - held))
            return (
                f"another weight-cache daemon, not started by this supervisor, holds {others}; "
                "stop it, or give this supervisor a --socket-dir of its own"
            )
        assert old is not None
        self._outcome(
            "handing-over",
            "hand-over",
            f"daemon pid {new.pid} loaded and verified {new.identity}; daemon pid {old.pid} ({old.identity}) "
            f"hands over {', '.join(sorted(wanted))}",
            held=old,
        )
        old.hand_over()
        return None

    def _retire(self, daemon: Daemon) -> None:
        """Keep a daemon that handed its socket path over until no engine maps its weights."""
        if daemon not in self.retired:
            self.retired.append(daemon)
            self._write_retired()

    def _drain_retired(self) -> None:
        """Stop each retired daemon that no running engine was handed weights by (``zero_copy`` maps them)."""
        for daemon in list(self.retired):
            engines: list[int] = []
            if daemon.alive():
                daemon.watch.poll()
                engines = daemon.watch.live_clients()
            if engines:
                if self._kept_for.get(daemon.pid) != engines:
                    self._kept_for[daemon.pid] = engines
                    self._outcome(
                        "keeping",
                        "kept-for-engines",
                        f"daemon pid {daemon.pid} ({daemon.identity}) handed its socket path over and is "
                        f"kept running: engine pid(s) {', '.join(map(str, engines))} still map its weights",
                        held=daemon,
                    )
                continue
            how = daemon.stop(self.cfg.stop_timeout)
            self.retired.remove(daemon)
            self._kept_for.pop(daemon.pid, None)
            self._write_retired()
            self._outcome(
                "stopped",
                "stopped-old",
                f"previous daemon pid {daemon.pid} ({daemon.identity}) {how}: "
                "no running engine maps its weights",
                held=daemon,
            )

    def _wait_retired_gone(self, daemon: Daemon) -> bool:
        """One at a time: wait until ``daemon`` was drained and stopped; False when asked to stop first."""
        while daemon in self.retired:
            self._drain_retired()
            if daemon not in self.retired:
                break
            self._write_status()
            if self.stop_event.wait(self.cfg.interval):
                return False
        return True

    def _write_retired(self) -> None:
        st.write_json(os.path.join(self.state_dir, st.RETIRED), [d.record() for d in self.retired])

    def _failed(self, target: Target, error: str) -> None:
        count = self.failure.count + 1 if self.failure and self.failure.identity == target.identity else 1
        self.failure = Failure(target.identity or "", count, time.time() + self._backoff(count), error)
        self.last_error = error
        self._move_to(State.FAILED)
        kept = ""
        if self.held is not None and not self.held_dead:
            kept = f"; daemon pid {self.held.pid} still holds the previous identity {self.held.identity}"
        self._outcome(
            "failed",
            "failed",
            f"preload of {target.identity} from {target.folder} failed: {error}{kept}; "
            f"retry in {self._backoff(count):.0f}s",
        )
        self._write_status()

    def _forget(self) -> None:
        st.remove(os.path.join(self.state_dir, st.DAEMON))

    # ------------------------------------------------------------- recovery

    def _recover(self) -> None:
        """Adopt the daemons a previous supervisor left running, if the live processes prove they are ours."""
        try:
            previous = st.read_status(self.state_dir)
        except CkptpubError:  # none, or not a supervisor's: this supervisor writes its own
            previous = {}
        self.generation = int(previous.get("generation") or 0)
        loading = st.read_record(os.path.join(self.state_dir, st.LOADING))
        if loading:
            self.generation = max(self.generation, int(loading.get("generation") or 0))
            daemon, why = Daemon.adopt(loading, self.ready_re)
            if daemon is not None:
                how = daemon.stop(self.cfg.stop_timeout)
                self._outcome(
                    "stopped",
                    "cleanup",
                    f"a previous supervisor left daemon pid {daemon.pid} loading "
                    f"{daemon.identity} unconfirmed: {how}",
                    held=daemon,
                )
            st.remove(os.path.join(self.state_dir, st.LOADING))
        retired = st.read_json(os.path.join(self.state_dir, st.RETIRED))
        for record in retired if isinstance(retired, list) else []:
            if schema.problem(schema.DAEMON_RECORD, record) is None:
                daemon, why = Daemon.adopt(record, self.ready_re, retired=True)
                if daemon is not None and not why:
                    self.retired.append(daemon)
                elif daemon is not None:
                    daemon.stop(self.cfg.stop_timeout)
        self._write_retired()
        record = st.read_record(os.path.join(self.state_dir, st.DAEMON))
        if record is None:
            if os.path.lexists(os.path.join(self.state_dir, st.DAEMON)):
                self._outcome(
                    "not-adopted", "not-adopted", f"previous daemon not adopted: {st.DAEMON} is not a record"
                )
            return
        self.generation = max(self.generation, int(record.get("generation") or 0))
        daemon, why = Daemon.adopt(record, self.ready_re)
        if daemon is not None and not why:
            self.held, self.held_dead = daemon, False
            self._move_to(State.READY)
            self._outcome(
                "adopted",
                "adopted",
                f"daemon pid {daemon.pid} still holds {daemon.identity} from {daemon.folder} (checked: pid "
                f"start time, command line, environment, log): adopted, not reloaded",
                held=daemon,
            )
            return
        if daemon is not None:  # ours, but we cannot confirm what it holds: do not leave it running unknown
            how = daemon.stop(self.cfg.stop_timeout)
            why = f"{why}; {how}"
        self._outcome("not-adopted", "not-adopted", f"previous daemon not adopted: {why}")
        st.remove(os.path.join(self.state_dir, st.DAEMON))

    # ------------------------------------------------------------- shutdown

    def _shutdown(self, why: str) -> None:
        """Stop every daemon this supervisor started (loading, held, retired); record ``why`` it stopped."""
        parts = []
        if self.loading is not None:
            parts.append(f"loading daemon pid {self.loading.pid} {self.loading.stop(self.cfg.stop_timeout)}")
            st.remove(os.path.join(self.state_dir, st.LOADING))
        if self.held is not None:
            if self.held_dead:
                parts.append(f"daemon pid {self.held.pid} had already exited")
            else:
                parts.append(self._stop_for_good(self.held))
            self._forget()
        for daemon in self.retired:
            parts.append(self._stop_for_good(daemon))
        self.retired = []
        self._write_retired()
        self.held = None
        self._move_to(State.STOPPED)
        self._outcome(
            "stopped", "supervisor-stop", f"{why}: " + ("; ".join(parts) or "no daemon was running")
        )
        self._write_status()

    def _stop_for_good(self, daemon: Daemon) -> str:
        """Stop a daemon as the supervisor ends, naming the engines that still mapped its weights."""
        engines = daemon.watch.live_clients()
        how = daemon.stop(self.cfg.stop_timeout)
        still = f" (engine pid(s) {', '.join(map(str, engines))} still mapped its weights)" if engines else ""
        return f"daemon pid {daemon.pid} ({daemon.identity}) {how}{still}"

    # -------------------------------------------------------------- records

    def _held_json(self, d: Daemon | None, alive: bool = True) -> dict[str, Any] | None:
        if d is None:
            return None
        return {
            "identity": d.identity,
            "folder": d.folder,
            "pid": d.pid,
            "since": d.ready_at or d.since,
            "socket_dir": socket_dir_of(d),
            "sockets": d.watch.sockets(),
            "engines": d.watch.live_clients() if alive else [],
            "generation": d.generation,
            "log": d.log_path,
            "alive": alive,
        }

    def _log_decision(self, decision: Decision, target: Target) -> None:
        self.last_decision = self._record(
            "decision",
            decision.action,
            decision.why,
            decision.reason,
            target=target.to_json(),
            held=self._held_json(self.held, not self.held_dead),
        )
        self.last_logged = (decision.action, decision.why)

    def _outcome(self, action: str, why: str, reason: str, held: Daemon | None = None) -> None:
        """Record what happened (``event: outcome``), fields in ``Decision``'s order: action, why, reason."""
        details: dict[str, Any] = {}
        if held is not None:
            details["daemon"] = {
                "pid": held.pid,
                "identity": held.identity,
                "folder": held.folder,
                "generation": held.generation,
            }
        self._record("outcome", action, why, reason, **details)

    def _record(self, event: str, action: str, why: str, reason: str, **details: Any) -> dict[str, Any]:
        """Append one entry to the decision log and say it on stderr; return the entry."""
        entry = {
            "time": time.time(),
            "event": event,
            "action": action,
            "why": why,
            "reason": reason,
            **details,
        }
        st.append_decision(self.state_dir, entry)
        self._say(f"{action} [{why}] {reason}")
        return entry

    def _say(self, line: str) -> None:
        if not self.cfg.quiet:
            try:
                print(f"ckptpub preload: {one_line(line)}", file=sys.stderr, flush=True)
            except (
                OSError,
                ValueError,
            ):  # stderr went away (closed pipe, detached terminal): keep supervising
                self.cfg.quiet = True

    def _write_status(self) -> None:
        data = {
            "state": self.state.value,
            "supervisor_pid": os.getpid(),
            "updated": time.time(),
            "generation": self.generation,
            "mode": "overlap" if self.cfg.overlap else "one-at-a-time",
            "follow": self.cfg.follow,
            "model_dir": self.cfg.model_dir,
            "daemon_cmd": self.cfg.daemon_cmd,
            "target": self.target.to_json() if self.target else None,
            "held": self._held_json(self.held, not self.held_dead),
            "loading": self._held_json(self.loading),
            "retired": [self._held_json(d) for d in self.retired],
            "socket_dir": socket_dir_of(self.held) if self.held is not None and not self.held_dead else None,
            "last_decision": self.last_decision,
            "last_error": self.last_error,
        }
        st.write_json(os.path.join(self.state_dir, st.STATUS), data)


def socket_dir_of(daemon: Daemon) -> str | None:
    """Where the daemon's sockets are: ``--socket-dir``, else the folder of the path it reported serving."""
    if daemon.socket_dir is not None:
        return daemon.socket_dir
    sockets = daemon.watch.sockets() or sorted(daemon.watch.handed_over.values())
    return os.path.dirname(sockets[0]) if sockets else None
