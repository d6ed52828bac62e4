"""Start, confirm, stop and adopt one daemon command (``vllm preload`` or a wrapper of it).

**Command.** A template split like a shell line (``shlex``), with placeholders
substituted per launch: ``{folder}`` (the checkpoint's real path), ``{socket_dir}``
(the weight-cache socket directory of this generation), ``{identity}`` and
``{python}`` (the supervisor's interpreter); the user's extra arguments (after
``--``) are appended. The default is :data:`DEFAULT_COMMAND`, ``vllm preload`` run
through :mod:`.vllm_launcher`. Operators wrap it (``numactl ... vllm preload ...``,
``docker exec ...``); tests substitute a stand-in.

**Process.** Each daemon command runs in a session (and process group) of its own,
with stdin from ``/dev/null`` and stdout/stderr to ``logs/daemon-G.log`` in the state
directory, not a pipe: it keeps running and logging when the supervisor dies, which
is what lets a restarted supervisor adopt it. Its environment carries
``CKPTPUB_PRELOAD_IDENTITY`` (the identity it was started for, checked again on
adoption through ``/proc/PID/environ``) and ``CKPTPUB_REQUIRE_MANIFEST=1`` (the
plugin then refuses, in the daemon, a folder without a manifest).

**Confirmation.** The identity a daemon holds is what the daemon process itself
reports, not what the supervisor expects: the ckptpub plugin's daemon wrapper
(:func:`ckptpub_vllm.daemon.run_daemon`) logs, in each spawned daemon process,
``ckptpub: weight-cache daemon for DIR is keyed by checkpoint IDENTITY``; vLLM's
launcher logs ``Weight cache daemon READY`` once every rank has bound its socket.
A daemon is confirmed when the READY line has appeared, at least one identity line
has, every identity line names the expected identity, and the process is alive.
Both patterns are options, for wrappers that log differently.

**Stop.** ``SIGTERM`` to the process group (``vllm preload`` terminates its daemon
children on ``SIGTERM``), ``SIGKILL`` to the group after ``stop_timeout``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

#: ``vllm preload`` through :mod:`.vllm_launcher` (vLLM's own CLI, plus logging in the daemon children).
DEFAULT_COMMAND = (
    "{python} -m ckptpub_vllm.preload.vllm_launcher preload --model {folder} "
    "--weight-cache-socket-dir {socket_dir}"
)
IDENTITY_PATTERN = r"ckptpub: weight-cache daemon for .* is keyed by checkpoint (?P<identity>\S+)"
READY_PATTERN = r"Weight cache daemon READY"
IDENTITY_ENV = "CKPTPUB_PRELOAD_IDENTITY"


def build_argv(template: str, extra: list[str], *, folder: str, socket_dir: str, identity: str) -> list[str]:
    """The daemon's argv: ``template`` split like a shell line, placeholders filled, ``extra`` appended."""
    try:
        tokens = shlex.split(template)
    except ValueError as error:
        raise ValueError(f"--daemon-cmd: {error}") from None
    if not tokens:
        raise ValueError("--daemon-cmd is empty")
    values = {
        "{folder}": folder,
        "{socket_dir}": socket_dir,
        "{identity}": identity,
        "{python}": sys.executable,
    }
    argv = []
    for token in tokens:
        for placeholder, value in values.items():
            token = token.replace(placeholder, value)
        argv.append(token)
    return argv + list(extra)


# ---------------------------------------------------------------------------
# /proc helpers (Linux): is this pid still the process we started?


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of ``pid``, ``None`` if there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    fields = data[data.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def proc_cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    return [part.decode("utf-8", "surrogateescape") for part in data.split(b"\0")[:-1]]


def proc_environ(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    env = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def same_process(pid: int, start_ticks: int | None) -> bool:
    """Whether ``pid`` is alive (not a zombie) and is the process that started at ``start_ticks``."""
    info = proc_stat(pid)
    if info is None or info[0] in ("Z", "X"):
        return False
    return start_ticks is None or info[1] == start_ticks


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------


@dataclass
class LogWatch:
    """Follows a daemon's log file: identities it reported, whether it said READY, last lines."""

    path: str
    identity_re: re.Pattern[str]
    ready_re: re.Pattern[str]
    offset: int = 0
    partial: bytes = b""
    identities: list[str] = field(default_factory=list)
    ready: bool = False
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=5))

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read(4 << 20)
        except OSError:
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip("\r")
            if line.strip():
                self.tail.append(line.strip()[-300:])
            match = self.identity_re.search(line)
            if match:
                self.identities.append(
                    match.group("identity") if "identity" in match.groupdict() else match.group(1)
                )
            if self.ready_re.search(line):
                self.ready = True

    def last_line(self) -> str:
        return self.tail[-1] if self.tail else "(no output)"


@dataclass
class Daemon:
    """One launched (or adopted) daemon command and what it has said so far."""

    generation: int
    identity: str  # the identity it was started for
    folder: str
    stamp: list[int] | None
    argv: list[str]
    log_path: str
    socket_dir: str
    pid: int
    start_ticks: int | None
    since: float
    watch: LogWatch
    popen: subprocess.Popen[bytes] | None = None  # None when adopted
    ready_at: float | None = None
    exit_code: int | None = None
    log_offset: int = 0  # where this daemon's output starts in its log file

    @classmethod
    def launch(
        cls,
        *,
        generation: int,
        identity: str,
        folder: str,
        stamp: Any,
        argv: list[str],
        log_path: str,
        socket_dir: str,
        identity_re: re.Pattern[str],
        ready_re: re.Pattern[str],
        env: dict[str, str] | None = None,
    ) -> Daemon:
        """Start ``argv`` in its own session with output to ``log_path``."""
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        child_env = dict(os.environ if env is None else env)
        child_env[IDENTITY_ENV] = identity
        child_env.setdefault("CKPTPUB_REQUIRE_MANIFEST", "1")
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        with open(log_path, "ab") as log:
            offset = log.tell()
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env,
                start_new_session=True,
                close_fds=True,
            )
        info = proc_stat(popen.pid)
        watch = LogWatch(log_path, identity_re, ready_re, offset=offset)
        daemon = cls(
            generation=generation,
            identity=identity,
            folder=folder,
            stamp=list(stamp) if stamp else None,
            argv=list(argv),
            log_path=log_path,
            socket_dir=socket_dir,
            pid=popen.pid,
            start_ticks=info[1] if info else None,
            since=time.time(),
            watch=watch,
            popen=popen,
        )
        daemon.log_offset = offset
        return daemon

    # -- liveness -----------------------------------------------------------

    def alive(self) -> bool:
        if self.popen is not None:
            code = self.popen.poll()
            if code is not None:
                self.exit_code = code
                return False
            return True
        return same_process(self.pid, self.start_ticks)

    # -- confirmation -------------------------------------------------------

    def check(self) -> tuple[str, str]:
        """``("loading" | "ready" | "failed", detail)`` from the log and the process."""
        self.watch.poll()
        wrong = [i for i in self.watch.identities if i != self.identity]
        if wrong:
            return "failed", f"the daemon reported identity {wrong[0]}, expected {self.identity}"
        if not self.alive():
            self.watch.poll()
            code = f" with code {self.exit_code}" if self.exit_code is not None else ""
            return "failed", f"daemon command exited{code} before it was ready: {self.watch.last_line()}"
        if self.watch.ready:
            if not self.watch.identities:
                return "failed", (
                    "the daemon reported READY but no manifest-keyed identity (is the ckptpub plugin "
                    "loaded in the daemon? check VLLM_PLUGINS and --identity-pattern)"
                )
            if self.ready_at is None:
                self.ready_at = time.time()
            return "ready", f"daemon pid {self.pid} reported identity {self.identity} and READY"
        return "loading", "loading"

    # -- stop ---------------------------------------------------------------

    def stop(self, timeout: float = 60.0) -> str:
        """SIGTERM the process group, wait up to ``timeout``, then SIGKILL it; returns what happened."""
        if self.popen is None and not same_process(self.pid, self.start_ticks):
            return "already gone"  # an adopted pid we can no longer vouch for: never signal it
        how = "stopped (SIGTERM)"
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self._running() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._running():
            how = f"killed (SIGKILL after {timeout:.0f}s)"
            self._signal(signal.SIGKILL)
            deadline = time.monotonic() + 10
            while self._running() and time.monotonic() < deadline:
                time.sleep(0.05)
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.exit_code = self.popen.wait(timeout=1)
        return how

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:  # pragma: no cover - a group we cannot signal; try the leader
            with contextlib.suppress(OSError):
                os.kill(self.pid, sig)

    def _running(self) -> bool:
        if self.popen is not None:
            self.popen.poll()
            if self.popen.returncode is None:
                return True
        elif same_process(self.pid, self.start_ticks):
            return True
        return group_alive(self.pid)

    # -- records for adoption ----------------------------------------------

    def record(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "identity": self.identity,
            "folder": self.folder,
            "stamp": self.stamp,
            "argv": self.argv,
            "log": self.log_path,
            "socket_dir": self.socket_dir,
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "since": self.since,
            "ready_at": self.ready_at,
            "log_offset": self.log_offset,
        }

    @classmethod
    def adopt(
        cls, record: dict[str, Any], identity_re: re.Pattern[str], ready_re: re.Pattern[str]
    ) -> tuple[Daemon | None, str]:
        """Re-attach to the daemon described by ``record`` if the live process proves it is that daemon.

        Checked with the live process: the pid is alive and started at the recorded
        clock tick (not a reused pid), its command line is the recorded argv, its
        environment names the recorded identity, and its log (from the start) shows
        READY and only that identity. Returns ``(daemon, "")`` or ``(None, why not)``.
        """
        try:
            pid = int(record["pid"])
            identity = str(record["identity"])
            argv = list(record["argv"])
        except (KeyError, TypeError, ValueError):
            return None, "the daemon record is unreadable"
        start_ticks = record.get("start_ticks")
        if not same_process(pid, start_ticks):
            return None, f"daemon pid {pid} is no longer running"
        if proc_cmdline(pid) != argv:
            return None, f"pid {pid} is running another command (pid reused?)"
        env = proc_environ(pid)
        if env is not None and env.get(IDENTITY_ENV) != identity:
            return None, f"pid {pid} was not started for {identity}"
        offset = int(record.get("log_offset") or 0)
        watch = LogWatch(str(record.get("log")), identity_re, ready_re, offset=offset)
        daemon = cls(
            generation=int(record.get("generation", 0)),
            identity=identity,
            folder=str(record.get("folder")),
            stamp=record.get("stamp"),
            argv=argv,
            log_path=str(record.get("log")),
            socket_dir=str(record.get("socket_dir")),
            pid=pid,
            start_ticks=start_ticks,
            since=float(record.get("since") or time.time()),
            watch=watch,
            ready_at=record.get("ready_at"),
        )
        daemon.log_offset = offset
        state, detail = daemon.check()
        if state != "ready":
            return (
                daemon,
                f"pid {pid} is ours but not confirmed: {detail if state == 'failed' else 'still loading'}",
            )
        return daemon, ""
