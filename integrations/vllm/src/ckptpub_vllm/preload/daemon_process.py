"""Start, confirm, hand over, stop and adopt one daemon command (``vllm preload`` or a wrapper of it).

**Command.** A template split like a shell line (``shlex``), with placeholders
substituted per launch: ``{folder}`` (the checkpoint's real path), ``{identity}``,
``{python}`` (the supervisor's interpreter) and ``{socket_dir}`` (``--socket-dir``,
for wrappers that must place it themselves); the user's extra arguments (after
``--``) are appended. The default is :data:`DEFAULT_COMMAND`, ``vllm preload`` run
through :mod:`.vllm_launcher`, on vLLM's default socket path (the one engines use
when they are given no socket option). Operators wrap it (``numactl ... vllm
preload ...``, ``docker exec ...``); tests substitute a stand-in.

**Process.** Each daemon command runs in a session (and process group) of its own,
with stdin from ``/dev/null`` and stdout/stderr to ``logs/daemon-G.log`` in the state
directory (opened, and read back, by ``shared.own_files``: never through a symlink, never
blocking on a FIFO), not a pipe: it keeps running and logging when the supervisor dies, which
is what lets a restarted supervisor adopt it. Its environment carries
``CKPTPUB_PRELOAD_IDENTITY`` (the identity it was started for, checked again on
adoption through ``/proc/PID/environ``), ``CKPTPUB_REQUIRE_MANIFEST=1`` (the plugin
then refuses, in the daemon, a folder without a manifest) and, in overlap mode,
``CKPTPUB_PRELOAD_TAKEOVER=1`` (wait for the socket path instead of failing).

**Confirmation.** The identity a daemon holds is what the daemon's processes report
(``ckptpub_vllm.shared.daemon_reports``, written by the plugin inside each of them), not what
the supervisor expects: the manifest each one was keyed by (read once), the identity
its load verified every tensor against, and the ``checkpoint`` field of the key it
serves with; vLLM's launcher logs ``Weight cache daemon READY`` once every rank has
bound its socket. A daemon is confirmed when READY has appeared, every process that
reported was keyed by and verified the expected identity and nothing else, and the
process is alive.

**Hand-over.** A daemon that is replaced is asked, on its socket, to give up the
socket path (``ckptpub_hand_over``); it keeps its weights (engines in ``zero_copy``
mode map them) until it is stopped.

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
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ckptpub.errors import CkptpubError
from ckptpub.integration import PRELOAD_IDENTITY_ENV, PRELOAD_TAKEOVER_ENV, OpenError

from ..shared import daemon_reports
from ..shared.daemon_reports import proc_stat
from ..shared.own_files import APPEND, make_folder, open_own, read_own
from . import failures

#: ``vllm preload`` through :mod:`.vllm_launcher` (vLLM's own CLI, plus logging in the daemon children).
DEFAULT_COMMAND = "{python} -m ckptpub_vllm.preload.vllm_launcher preload --model {folder}"
READY_PATTERN = r"Weight cache daemon READY"


def build_argv(
    template: str, extra: list[str], *, folder: str, socket_dir: str | None, identity: str
) -> list[str]:
    """The daemon's argv: ``template`` split like a shell line, placeholders filled, ``extra`` appended.

    With a ``socket_dir`` (``--socket-dir``), ``--weight-cache-socket-dir DIR`` comes
    before ``extra`` unless the template places ``{socket_dir}`` itself; without one
    the daemon uses vLLM's default socket path, the one engines find with no option.
    """
    try:
        tokens = shlex.split(template)
    except ValueError as error:
        raise ValueError(f"--daemon-cmd: {error}") from None
    if not tokens:
        raise ValueError("--daemon-cmd is empty")
    if socket_dir is None and "{socket_dir}" in template:
        raise ValueError("--daemon-cmd uses {socket_dir}: give the directory with --socket-dir")
    values = {
        "{folder}": folder,
        "{socket_dir}": socket_dir or "",
        "{identity}": identity,
        "{python}": sys.executable,
    }
    argv = []
    for token in tokens:
        for placeholder, value in values.items():
            token = token.replace(placeholder, value)
        argv.append(token)
    if socket_dir is not None and "{socket_dir}" not in template:
        argv += ["--weight-cache-socket-dir", socket_dir]
    return argv + list(extra)


# ---------------------------------------------------------------------------
# /proc helpers (Linux): is this pid still the process we started?


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
    """Follows a daemon's log file: its reports (``daemon_reports``), vLLM's READY line, the last lines.

    Reports are kept per daemon process (``pid``): a daemon of several ranks has one
    process, and one set of reports, per rank.
    """

    path: str
    ready_re: re.Pattern[str]
    offset: int = 0
    partial: bytes = b""
    keyed: dict[int, str | None] = field(default_factory=dict)  # pid -> identity (None: no manifest)
    verified: dict[int, str] = field(default_factory=dict)  # pid -> identity
    waiting: dict[int, str] = field(default_factory=dict)  # pid -> socket path
    serving: dict[int, str] = field(default_factory=dict)  # pid -> socket path
    reported: dict[int, str] = field(default_factory=dict)  # pid -> the key's identity (waiting/serving)
    handed_over: dict[int, str] = field(default_factory=dict)  # pid -> socket path given up
    clients: dict[int, int | None] = field(default_factory=dict)  # engine pid -> its start ticks
    ready: bool = False
    unreadable: str | None = None  # why the log cannot be read (a symlink, a FIFO at its name)
    last_exception: str | None = None
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=5))

    def poll(self) -> None:
        try:
            data = read_own(self.path, 4 << 20, self.offset)
        except OpenError as error:
            if not error.absent:
                self.unreadable = str(error)
            return
        except CkptpubError as error:  # a FIFO, a folder, a device planted at its name
            self.unreadable = str(error)
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        for raw in lines:
            self._line(raw.decode("utf-8", "replace").rstrip("\r"))

    def _line(self, line: str) -> None:
        report = daemon_reports.parse(line)
        if report is not None:
            self._report(report)
            return
        if line.strip():
            self.tail.append(line.strip()[-300:])
        exception = failures.exception_line(line)
        if exception is not None:
            self.last_exception = exception
        if self.ready_re.search(line):
            self.ready = True

    def _report(self, report: dict[str, Any]) -> None:
        pid, event = report.get("pid"), report["event"]
        if not isinstance(pid, int):
            return
        identity = report.get("identity")
        if event == daemon_reports.KEYED:
            self.keyed[pid] = identity if isinstance(identity, str) else None
        elif event == daemon_reports.VERIFIED and isinstance(identity, str):
            self.verified[pid] = identity
        elif event in (daemon_reports.WAITING, daemon_reports.SERVING):
            self.reported[pid] = identity if isinstance(identity, str) else "?"
            target = self.waiting if event == daemon_reports.WAITING else self.serving
            target[pid] = str(report.get("socket"))
            if event == daemon_reports.SERVING:
                self.waiting.pop(pid, None)
        elif event == daemon_reports.HANDED_OVER:
            self.handed_over[pid] = str(report.get("socket"))
            self.serving.pop(pid, None)
        elif event == daemon_reports.CLIENT and isinstance(report.get("client_pid"), int):
            start = report.get("client_start")
            self.clients[report["client_pid"]] = start if isinstance(start, int) else None
        elif event == daemon_reports.RELEASED and isinstance(report.get("client_pid"), int):
            self.clients.pop(report["client_pid"], None)

    def identities(self) -> list[str | None]:
        """Every identity the daemon's processes reported holding, in key, load and socket reports."""
        return [*self.keyed.values(), *self.verified.values(), *self.reported.values()]

    def live_clients(self) -> list[int]:
        """Engine processes that were handed this daemon's weights and are still running."""
        return sorted(pid for pid, start in self.clients.items() if same_process(pid, start))

    def sockets(self) -> list[str]:
        return sorted(set(self.serving.values()))

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
    socket_dir: str | None  # --socket-dir; None: vLLM's default socket path
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
        socket_dir: str | None,
        ready_re: re.Pattern[str],
        takeover: bool,
    ) -> Daemon:
        """Start ``argv`` in its own session with output to ``log_path``.

        ``takeover``: the daemon waits for the socket path's lock when another daemon
        holds it, instead of failing (``daemon_serving``).
        """
        make_folder(os.path.dirname(log_path))
        child_env = dict(os.environ)
        child_env[PRELOAD_IDENTITY_ENV] = identity
        child_env.setdefault("CKPTPUB_REQUIRE_MANIFEST", "1")
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        if takeover:
            child_env[PRELOAD_TAKEOVER_ENV] = "1"
        log = open_own(log_path, APPEND)  # CkptpubError naming it: a symlink, a FIFO, a folder there
        try:
            offset = os.lseek(log, 0, os.SEEK_END)
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(log)
        info = proc_stat(popen.pid)
        return cls(
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
            watch=LogWatch(log_path, ready_re, offset=offset),
            popen=popen,
            log_offset=offset,
        )

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
        """``(verdict, detail)`` from the daemon's reports, its log and the process.

        Verdicts: ``loading``; ``waiting`` (every process that reported loaded and
        verified the expected identity, and some wait to take over a socket path);
        ``ready``; ``failed`` (worth retrying); ``permanent`` (cannot succeed on retry).
        """
        self.watch.poll()
        watch = self.watch
        if watch.unreadable is not None:
            return "permanent", f"its log cannot be read: {watch.unreadable}"
        wrong = [i for i in watch.identities() if i != self.identity]
        if wrong:
            if wrong[0] is None:
                return "failed", "the daemon found no ckptpub.json to key by (its key is vLLM's header hash)"
            return "failed", f"the daemon reported identity {wrong[0]}, expected {self.identity}"
        if not self.alive():
            watch.poll()
            code = f" with code {self.exit_code}" if self.exit_code is not None else ""
            reason = watch.last_exception or watch.last_line()
            permanent = failures.permanent_reason(watch.last_exception, self.exit_code)
            if permanent is not None:
                return "permanent", f"{permanent} (daemon command exited{code}; log {self.log_path})"
            return "failed", f"daemon command exited{code} before it was ready: {reason}"
        processes = set(watch.keyed)
        unverified = sorted(processes - set(watch.verified))
        if watch.ready:
            if not processes:
                return "failed", (
                    "the daemon reported READY but nothing from the ckptpub plugin (is the plugin loaded "
                    "in the daemon? check VLLM_PLUGINS)"
                )
            if unverified:
                return "failed", (
                    f"daemon process {unverified[0]} loaded without verifying every tensor against the "
                    "manifest (a load format other than manifest_cache, or verify false)"
                )
            if self.ready_at is None:
                self.ready_at = time.time()
            return "ready", f"daemon pid {self.pid} reported identity {self.identity}, verified, and READY"
        if watch.waiting and not unverified and processes <= set(watch.waiting) | set(watch.serving):
            sockets = ", ".join(sorted(set(watch.waiting.values())))
            return "waiting", f"daemon pid {self.pid} verified {self.identity} and waits for {sockets}"
        return "loading", "loading"

    # -- hand-over ----------------------------------------------------------

    def hand_over(self, taken_by: Daemon | None = None) -> list[str]:
        """Ask each of the daemon's processes to give its socket path up (``ckptpub_hand_over``).

        Returns the paths asked. A path that ``taken_by`` serves is not asked: its lock
        has one holder, so this daemon let it go and only its report is still to come.
        Each request names the process it is meant for, and a newer daemon that took
        the path over in between refuses it. The daemon keeps running, with its
        weights, for the engines that mapped them; ``watch.handed_over`` fills as each
        process reports it.
        """
        taken = set(taken_by.watch.sockets()) if taken_by is not None else set()
        asked = []
        for pid, path in sorted(self.watch.serving.items()):
            if path not in taken and send_command(path, daemon_reports.HAND_OVER_COMMAND, pid=pid):
                asked.append(path)
        return asked

    def handed_over(self) -> bool:
        self.watch.poll()
        return not self.watch.serving

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
        cls, record: dict[str, Any], ready_re: re.Pattern[str], retired: bool = False
    ) -> tuple[Daemon | None, str]:
        """Re-attach to the daemon described by ``record`` if the live process proves it is that daemon.

        Checked with the live process: the pid is alive and started at the recorded
        clock tick (not a reused pid), its command line is the recorded argv, its
        environment names the recorded identity, and its log (from the start) shows
        READY and only that identity (for a ``retired`` daemon, one that handed its
        socket path over, only that identity). Returns ``(daemon, "")`` or ``(None, why not)``.
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
        if env is not None and env.get(PRELOAD_IDENTITY_ENV) != identity:
            return None, f"pid {pid} was not started for {identity}"
        offset = int(record.get("log_offset") or 0)
        socket_dir = record.get("socket_dir")
        daemon = cls(
            generation=int(record.get("generation", 0)),
            identity=identity,
            folder=str(record.get("folder")),
            stamp=record.get("stamp"),
            argv=argv,
            log_path=str(record.get("log")),
            socket_dir=str(socket_dir) if socket_dir else None,
            pid=pid,
            start_ticks=start_ticks,
            since=float(record.get("since") or time.time()),
            watch=LogWatch(str(record.get("log")), ready_re, offset=offset),
            ready_at=record.get("ready_at"),
            log_offset=offset,
        )
        state, detail = daemon.check()
        if retired:
            wrong = state == "failed" and "reported identity" in detail
            return (daemon, f"pid {pid} is ours but {detail}") if wrong else (daemon, "")
        if state != "ready":
            return (
                daemon,
                f"pid {pid} is ours but not confirmed: {detail if state == 'failed' else 'still loading'}",
            )
        return daemon, ""


def send_command(socket_path: str, command: str, timeout: float = 5.0, **fields: Any) -> bool:
    """Send one of ckptpub's own requests to a daemon's socket; whether it was sent.

    Only to a socket owned by this user (not a symlink), as vLLM's engines check
    before they connect. The answer is read and discarded: what the daemon did is
    in its reports.
    """
    try:
        info = os.lstat(socket_path)
    except OSError:
        return False
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        try:
            conn.connect(socket_path)
            conn.sendall(daemon_reports.command_frame(command, **fields))
            conn.recv(4096)
        except OSError:
            return False
    return True
