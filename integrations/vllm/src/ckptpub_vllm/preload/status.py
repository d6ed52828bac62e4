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
line, which readers skip.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from typing import Any

from ckptpub.errors import CkptpubError, one_line
from ckptpub.integration import PRELOAD_STATE_DIR_ENV, jsonfiles

STATUS = "status.json"
DECISIONS = "decisions.jsonl"
DAEMON = "daemon.json"
LOADING = "loading.json"
RETIRED = "retired.json"
LOCK = "supervisor.lock"

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


def remove(path: str) -> None:
    """Remove ``path`` if it is there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def append_decision(state_dir: str, entry: dict[str, Any]) -> None:
    """Append one entry to the decision log (a whole line in one ``write``, fsynced)."""
    jsonfiles.append_line(os.path.join(state_dir, DECISIONS), entry, DECISIONS)


def read_decisions(state_dir: str) -> list[dict[str, Any]]:
    """Every complete entry of the decision log, oldest first (a torn or corrupt line is skipped)."""
    lines = jsonfiles.read_lines(os.path.join(state_dir, DECISIONS), MAX_LOG_BYTES, DECISIONS)
    return [entry for _, entry in lines if isinstance(entry, dict)]


class SupervisorLock:
    """An exclusive ``flock`` on ``supervisor.lock``: one supervisor per state directory.

    The descriptor is close-on-exec, so daemons started by the supervisor do not
    inherit it and the lock goes away with the supervisor, even after ``SIGKILL``.
    """

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, LOCK)
        self.fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                owner = _read_small(self.path).strip() or "?"
                raise RuntimeError(f"another supervisor (pid {owner}) uses this state directory") from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _read_small(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read(64)
    except OSError:
        return ""


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
