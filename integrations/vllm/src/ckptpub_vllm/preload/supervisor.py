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

Replacement. Default (overlap): start the new daemon in a fresh socket directory
(generation ``G``: ``STATE/sockets/gG``), wait until it reports the target identity
and READY, record it, then stop the old one. vLLM's daemon holds a per-GPU lock on
its socket path for its lifetime, so two daemons cannot share one socket directory;
engines read the current ``socket_dir`` from the status. With ``--one-at-a-time``
(implied by a fixed ``--socket-dir``) the old daemon is stopped first and the new
one binds the same socket path; engines started with ``fallback: false`` wait for it
(vLLM's ``state_timeout_s``) instead of loading stale weights.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from types import FrameType
from typing import Any

from . import status as st
from .daemon_process import DEFAULT_COMMAND, IDENTITY_PATTERN, READY_PATTERN, Daemon, build_argv
from .decide import Decision, Failure, Held, Target, decide
from .observe import (
    ManifestCache,
    manifests_to_compare,
    observe_folder,
    observe_run,
    same_model_in_newer_format,
)

#: A daemon that ran at least this long after READY is "healthy": its death restarts at once.
HEALTHY_S = 60.0
#: ``vllm_weight_cache_<32 hex>_draft.sock`` (vLLM's socket name, draft role), and sun_path's usable size.
SOCKET_NAME_LEN, AF_UNIX_MAX = 61, 107


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
    identity_pattern: str = IDENTITY_PATTERN
    ready_pattern: str = READY_PATTERN
    quiet: bool = False

    @property
    def overlap(self) -> bool:
        return not self.one_at_a_time and self.socket_dir is None


class Supervisor:
    """Keeps one daemon holding the target's identity; :meth:`run` until ``SIGTERM``/``SIGINT``."""

    def __init__(self, config: Config) -> None:
        self.cfg = config
        self.state_dir = os.path.abspath(config.state_dir)
        self.identity_re = re.compile(config.identity_pattern)
        self.ready_re = re.compile(config.ready_pattern)
        self.cache = ManifestCache()
        self.stop_event = threading.Event()
        self.lock = st.SupervisorLock(self.state_dir)
        self.held: Daemon | None = None
        self.held_dead = False
        self.loading: Daemon | None = None
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
        os.makedirs(self.state_dir, exist_ok=True)
        self.lock.acquire()
        previous_handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._outcome(
                "info", "supervisor-start", f"supervisor pid {os.getpid()} started: {self._describe()}"
            )
            longest = self.cfg.socket_dir or os.path.join(self.state_dir, "sockets", "g99999")
            if len(longest) + 1 + SOCKET_NAME_LEN > AF_UNIX_MAX:
                self._outcome(
                    "info",
                    "warning",
                    f"socket paths under {longest} may exceed the AF_UNIX limit of "
                    f"{AF_UNIX_MAX} bytes; use a shorter --state-dir or --socket-dir",
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
        return observe_folder(self.cfg.model_dir or "", self.cache, verified_only=self.cfg.verified_only)

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
        if self.held is not None and not self.held_dead and not self.held.alive():
            self._held_died(now)
        target = self.observe()
        seen = set(self.previous.skipped) if self.previous is not None else set()
        for note in target.skipped:
            if note not in seen:
                self._outcome("info", "warning", f"{self.cfg.follow}: {note}")
        held = self.held_view()
        held_manifest, target_manifest = manifests_to_compare(held, target, self.cache)
        decision = decide(
            held,
            target,
            previous=self.previous,
            failure=self.failure,
            now=now,
            held_manifest=held_manifest,
            target_manifest=target_manifest,
            same_model=same_model_in_newer_format(held, target, self.cache),
        )
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

    def _settle_state(self, decision: Decision) -> None:
        if decision.why == "target-unusable":
            self._move_to(State.NO_TARGET)
        elif decision.why == "backoff":
            self._move_to(State.DEGRADED if self.held_dead else State.FAILED)
        elif (
            self.held is not None
            and not self.held_dead
            and self.target
            and (self.held.identity == self.target.identity or decision.why == "same-model-new-format")
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
        socket_dir = self.cfg.socket_dir or os.path.join(self.state_dir, "sockets", f"g{gen}")
        os.makedirs(socket_dir, mode=0o700, exist_ok=True)
        old = self.held
        if old is not None and (self.held_dead or not self.cfg.overlap):
            if not self.held_dead:
                self._outcome(
                    "stopping",
                    "stopping-old",
                    f"one at a time: stopping daemon pid {old.pid} ({old.identity}) before loading "
                    f"{target.identity}",
                    held=old,
                )
            how = old.stop(self.cfg.stop_timeout)
            if not self.held_dead:
                self._outcome("stopped", "stopped-old", f"daemon pid {old.pid} {how}", held=old)
            self._forget(old)
            self.held, self.held_dead, old = None, False, None
        argv = build_argv(
            self.cfg.daemon_cmd,
            self.cfg.extra,
            folder=target.folder,
            socket_dir=socket_dir,
            identity=target.identity,
        )
        log_path = os.path.join(self.state_dir, "logs", f"daemon-{gen}.log")
        try:
            new = Daemon.launch(
                generation=gen,
                identity=target.identity,
                folder=target.folder,
                stamp=target.stamp,
                argv=argv,
                log_path=log_path,
                socket_dir=socket_dir,
                identity_re=self.identity_re,
                ready_re=self.ready_re,
            )
        except OSError as error:
            self._failed(target, f"cannot start the daemon command {argv[0]!r}: {error.strerror or error}")
            return
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
        verdict, detail = self._wait_ready(new)
        self.loading = None
        if verdict != "ready":
            how = new.stop(self.cfg.stop_timeout)
            st.remove(os.path.join(self.state_dir, st.LOADING))
            self._cleanup_sockets(new)
            if verdict == "interrupted":
                self._outcome(
                    "stopped",
                    "interrupted",
                    f"stop requested while loading; daemon pid {new.pid} {how}",
                    held=new,
                )
                return
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
            how = old.stop(self.cfg.stop_timeout)
            self._outcome(
                "stopped",
                "stopped-old",
                f"previous daemon pid {old.pid} ({old.identity}) {how} after the new one was confirmed",
                held=old,
            )
            self._cleanup_sockets(old)
        self._move_to(State.READY)
        self._write_status()

    def _wait_ready(self, daemon: Daemon) -> tuple[str, str]:
        deadline = time.monotonic() + self.cfg.ready_timeout
        next_status = time.monotonic() + 5
        while True:
            verdict, detail = daemon.check()
            if verdict != "loading":
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

    def _forget(self, daemon: Daemon) -> None:
        st.remove(os.path.join(self.state_dir, st.DAEMON))
        self._cleanup_sockets(daemon)

    def _cleanup_sockets(self, daemon: Daemon) -> None:
        """Remove a generation's socket directory (only one we created under the state directory)."""
        root = os.path.join(self.state_dir, "sockets") + os.sep
        if self.cfg.socket_dir is None and daemon.socket_dir.startswith(root):
            shutil.rmtree(daemon.socket_dir, ignore_errors=True)

    # ------------------------------------------------------------- recovery

    def _recover(self) -> None:
        """Adopt the daemon a previous supervisor left running, if the live process proves it is ours."""
        previous = st.read_json(os.path.join(self.state_dir, st.STATUS)) or {}
        self.generation = int(previous.get("generation") or 0)
        loading = st.read_json(os.path.join(self.state_dir, st.LOADING))
        if loading:
            self.generation = max(self.generation, int(loading.get("generation") or 0))
            daemon, why = Daemon.adopt(loading, self.identity_re, self.ready_re)
            if daemon is not None:
                how = daemon.stop(self.cfg.stop_timeout)
                self._outcome(
                    "stopped",
                    "cleanup",
                    f"a previous supervisor left daemon pid {daemon.pid} loading "
                    f"{daemon.identity} unconfirmed: {how}",
                    held=daemon,
                )
                self._cleanup_sockets(daemon)
            st.remove(os.path.join(self.state_dir, st.LOADING))
        record = st.read_json(os.path.join(self.state_dir, st.DAEMON))
        if not record:
            return
        self.generation = max(self.generation, int(record.get("generation") or 0))
        daemon, why = Daemon.adopt(record, self.identity_re, self.ready_re)
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
            self._cleanup_sockets(daemon)
        self._outcome("not-adopted", "not-adopted", f"previous daemon not adopted: {why}")
        st.remove(os.path.join(self.state_dir, st.DAEMON))

    # ------------------------------------------------------------- shutdown

    def _shutdown(self, why: str) -> None:
        """Stop every daemon this supervisor started (loading or held), then record ``why`` it stopped."""
        parts = []
        if self.loading is not None:
            parts.append(f"loading daemon pid {self.loading.pid} {self.loading.stop(self.cfg.stop_timeout)}")
            st.remove(os.path.join(self.state_dir, st.LOADING))
        if self.held is not None:
            if self.held_dead:
                parts.append(f"daemon pid {self.held.pid} had already exited")
            else:
                how = self.held.stop(self.cfg.stop_timeout)
                parts.append(f"daemon pid {self.held.pid} ({self.held.identity}) {how}")
            self._forget(self.held)
        self.held = None
        self._move_to(State.STOPPED)
        self._outcome(
            "stopped", "supervisor-stop", f"{why}: " + ("; ".join(parts) or "no daemon was running")
        )
        self._write_status()

    # -------------------------------------------------------------- records

    def _held_json(self, d: Daemon | None, alive: bool = True) -> dict[str, Any] | None:
        if d is None:
            return None
        return {
            "identity": d.identity,
            "folder": d.folder,
            "pid": d.pid,
            "since": d.ready_at or d.since,
            "socket_dir": d.socket_dir,
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
                print(f"ckptpub preload: {line}", file=sys.stderr, flush=True)
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
            "socket_dir": self.held.socket_dir if self.held is not None and not self.held_dead else None,
            "last_decision": self.last_decision,
            "last_error": self.last_error,
        }
        st.write_json(os.path.join(self.state_dir, st.STATUS), data)
