"""The supervisor's state directory: what it holds, what it decided, and why.

Layout of ``--state-dir`` (one supervisor per directory, enforced by a lock)::

    status.json        rewritten atomically after every change: see :func:`format_status`
    decisions.jsonl    the decision log, one JSON object a line, appended
    daemon.json        the daemon that holds the weights now (pid, identity, command)
    loading.json       a daemon being loaded and not yet confirmed (absent otherwise)
    retired.json       replaced daemons kept running for the engines that still map their weights
    supervisor.lock    flock held by the running supervisor
    logs/daemon-G.log  stdout and stderr of generation G's daemon command

Every JSON file is replaced atomically and the decision log appended a whole line
at a time, both by :mod:`ckptpub.integration.jsonfiles` (the manifest's and the run index's
writer): a reader (``ckptpub preload --status``, a health check, the next
supervisor) never sees half a file, and a crash leaves at worst a torn last log
line, which readers skip. The lock and the daemon logs are opened by
``shared.own_files``. So no file here is written or read through a symlink, and none is
blocked on when it is a FIFO: a failure names the file. The folder itself, and ``logs``,
must be folders no other user may change (``own_files.check_folder``): the supervisor
acts on what it finds here (it adopts and stops the daemons its records name).
What is read is checked against the shapes the supervisor writes (:mod:`.schema`):
``--status`` refuses a ``status.json`` of another shape in one line, ``--history``
skips a line of another shape, saying so in one line.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable
from typing import Any

from ckptpub.errors import CkptpubError, one_line
from ckptpub.integration import PRELOAD_STATE_DIR_ENV, OpenError, jsonfiles

from ..shared.own_files import LOCK as LOCK_FILE
from ..shared.own_files import READ, check_folder, make_folder, open_own, read_own
from . import schema

STATUS = "status.json"
DECISIONS = "decisions.jsonl"
DAEMON = "daemon.json"
LOADING = "loading.json"
RETIRED = "retired.json"
LOCK = "supervisor.lock"
LOGS = "logs"

#: A status or daemon record larger than this is treated as unusable (it holds notes, not data).
MAX_FILE_BYTES = 64 << 20
#: A decision log larger than this is refused unread by :func:`read_decisions`.
MAX_LOG_BYTES = 256 << 20


def default_state_dir() -> str:
    """``$CKPTPUB_PRELOAD_STATE_DIR``, else ``$XDG_STATE_HOME/ckptpub/preload`` (``~/.local/state/...``)."""
    env = os.environ.get(PRELOAD_STATE_DIR_ENV)
    if env:
        return env
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "ckptpub", "preload")


def write_json(path: str, data: Any) -> None:
    """Replace ``path`` by ``data`` as JSON, atomically."""
    jsonfiles.write_json(path, data)


def read_json(path: str) -> Any | None:
    """The JSON in ``path``; ``None`` when it is missing or unusable (too large, not JSON, not a file)."""
    try:
        return jsonfiles.read_json(path, MAX_FILE_BYTES, os.path.basename(path))
    except CkptpubError:
        return None


def read_status(state_dir: str) -> dict[str, Any]:
    """``status.json`` as the supervisor wrote it; else ``CkptpubError`` naming the file and what is wrong."""
    path = os.path.join(state_dir, STATUS)
    try:
        data = jsonfiles.read_json(path, MAX_FILE_BYTES, path)
    except OpenError as error:
        if error.absent:
            raise CkptpubError(
                f"{state_dir}: no status (has a supervisor run with this --state-dir?)"
            ) from None
        raise
    why = schema.problem(schema.STATUS, data)
    if why is not None or not isinstance(data, dict):
        raise CkptpubError(f"{path}: not what a supervisor writes ({why}); not shown")
    return data


def read_record(path: str) -> dict[str, Any] | None:
    """A daemon record (``daemon.json``, ``loading.json``) as the supervisor wrote it; ``None`` otherwise."""
    data = read_json(path)
    return data if data is not None and schema.problem(schema.DAEMON_RECORD, data) is None else None


def remove(path: str) -> None:
    """Remove ``path`` if it is there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def append_decision(state_dir: str, entry: dict[str, Any]) -> None:
    """Append one entry to the decision log (a whole line in one ``write``, fsynced)."""
    jsonfiles.append_line(os.path.join(state_dir, DECISIONS), entry, DECISIONS)


def read_decisions(state_dir: str, on_skip: Callable[[int, str], None] | None = None) -> list[dict[str, Any]]:
    """Every entry of the decision log as the supervisor wrote it, oldest first.

    A torn, corrupt or hostile line (not JSON, or not the shape of an entry:
    ``schema.ENTRY``) is skipped and ``on_skip(line_number, why)`` told, as the run
    index's readers are.
    """
    lines = jsonfiles.read_lines(
        os.path.join(state_dir, DECISIONS),
        MAX_LOG_BYTES,
        DECISIONS,
        on_skip,
        check=lambda value: schema.problem(schema.ENTRY, value),
    )
    return [entry for _, entry in lines]


class SupervisorLock:
    """An exclusive ``flock`` on ``supervisor.lock``: one supervisor per state directory.

    The descriptor is close-on-exec, so daemons started by the supervisor do not
    inherit it and the lock goes away with the supervisor, even after ``SIGKILL``.
    Opened, like every file of the state directory, by ``shared.own_files``'s rule.
    """

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, LOCK)
        self.fd: int | None = None

    def acquire(self) -> None:
        fd = open_own(self.path, LOCK_FILE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                owner = self._holder()
                raise CkptpubError(f"another supervisor (pid {owner}) uses this state directory") from None
            raise CkptpubError(f"{self.path}: cannot lock: {error.strerror or error}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def held(self) -> bool:
        """Whether a supervisor holds the lock right now (``False`` when there is no lock file)."""
        try:
            fd = open_own(self.path, READ)
        except OpenError as error:
            if error.absent:
                return False
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def _holder(self) -> str:
        """The pid the holder wrote, as text, or ``?``."""
        try:
            text = read_own(self.path, 64).decode("ascii").strip()
        except (CkptpubError, UnicodeDecodeError):
            return "?"
        return text if text.isdigit() else "?"


def prepare(state_dir: str) -> None:
    """Make (or check) the state directory and its ``logs`` for a supervisor: ``CkptpubError`` naming the
    folder when it is not a folder, or one another user may change (``own_files.check_folder``)."""
    make_folder(state_dir, follow_symlink=True)
    make_folder(os.path.join(state_dir, LOGS))


def check_readable(state_dir: str) -> None:
    """Check the state directory before ``--status`` or ``--history`` trust what is in it."""
    if not os.path.lexists(state_dir):
        raise CkptpubError(f"{state_dir}: no state directory (has a supervisor run with this --state-dir?)")
    check_folder(state_dir, follow_symlink=True)


def log_path(state_dir: str, generation: int) -> str:
    """Where generation ``generation``'s daemon command writes its output."""
    return os.path.join(state_dir, LOGS, f"daemon-{generation}.log")


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s ago"
    if seconds < 7200:
        return f"{seconds // 60}m ago"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m ago"


def _clock(stamp: object) -> str:
    if not isinstance(stamp, int | float) or isinstance(stamp, bool) or not stamp:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def _when(stamp: float | None, now: float) -> str:
    if not stamp:
        return "-"
    return f"{_clock(stamp)} ({_ago(now - stamp)})"


def format_entry(entry: dict[str, Any]) -> str:
    """One decision-log entry as one line (``ckptpub preload --history``): when, what, why, in words."""
    kind = "decision" if entry.get("event") == "decision" else "outcome "
    text = f"{kind} {entry.get('action')} [{entry.get('why')}] {entry.get('reason', '')}"
    return f"{_clock(entry.get('time'))}  {one_line(text)}"


def format_status(status: dict[str, Any], now: float | None = None) -> str:
    """The human form of ``status.json`` (``ckptpub preload --status``)."""
    now = time.time() if now is None else now
    held = status.get("held") or {}
    target = status.get("target") or {}
    loading = status.get("loading") or {}
    last = status.get("last_decision") or {}
    alive = "running" if status.get("supervisor_alive") else "not running"
    lines = [
        f"state:      {status.get('state', '?')}",
        f"supervisor: pid {status.get('supervisor_pid', '?')} ({alive}), "
        f"updated {_when(status.get('updated'), now)}",
        f"held:       {held.get('identity') or '(nothing)'}",
    ]
    if held:
        lines += [
            f"  since:    {_when(held.get('since'), now)}",
            f"  folder:   {held.get('folder')}",
            f"  pid:      {held.get('pid')}" + ("" if held.get("alive", True) else " (exited)"),
            f"  sockets:  {', '.join(held.get('sockets') or []) or held.get('socket_dir')}",
        ]
        if held.get("engines"):
            lines.append(f"  engines:  pid {', '.join(map(str, held['engines']))} (mapped its weights)")
    for old in status.get("retired") or []:
        engines = ", ".join(map(str, old.get("engines") or [])) or "none"
        lines.append(
            f"retired:    {old.get('identity')} (pid {old.get('pid')}), kept for engine pid(s) {engines}"
        )
    if loading:
        lines.append(
            f"loading:    {loading.get('identity')} from {loading.get('folder')} (pid {loading.get('pid')})"
        )
    if target:
        if target.get("error"):
            lines.append(f"target:     unusable: {target['error']}")
        else:
            step = f" (step {target['step']})" if target.get("step") is not None else ""
            lines.append(f"target:     {target.get('identity')}{step} at {target.get('folder')}")
    if last:
        lines.append(f"last:       {last.get('action')} [{last.get('why')}] {_when(last.get('time'), now)}")
        lines.append(f"  because:  {last.get('reason')}")
    if status.get("last_error"):
        lines.append(f"error:      {status['last_error']}")
    return "\n".join(one_line(line) for line in lines)  # a folder's or a daemon's text: no control character
