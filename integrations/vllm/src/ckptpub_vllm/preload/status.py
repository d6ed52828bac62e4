"""The supervisor's state directory: what it holds, what it decided, and why.

Layout of ``--state-dir`` (one supervisor per directory, enforced by a lock)::

    status.json        rewritten atomically after every change: see :func:`format_status`
    decisions.jsonl    the decision log, one JSON object a line, appended
    daemon.json        the daemon that holds the weights now (pid, identity, command)
    loading.json       a daemon being loaded and not yet confirmed (absent otherwise)
    supervisor.lock    flock held by the running supervisor
    logs/daemon-G.log  stdout and stderr of generation G's daemon command
    sockets/gG/        generation G's weight-cache socket directory (overlap mode)

Every JSON file is written to a temporary file, fsynced and renamed, so a reader
(``ckptpub preload --status``, a health check, the next supervisor) never sees half
a file. The decision log is append-only; each line is written with one ``write``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from typing import Any

STATUS = "status.json"
DECISIONS = "decisions.jsonl"
DAEMON = "daemon.json"
LOADING = "loading.json"
LOCK = "supervisor.lock"

STATE_DIR_ENV = "CKPTPUB_PRELOAD_STATE_DIR"


def default_state_dir() -> str:
    """``$CKPTPUB_PRELOAD_STATE_DIR``, else ``$XDG_STATE_HOME/ckptpub/preload`` (``~/.local/state/...``)."""
    env = os.environ.get(STATE_DIR_ENV)
    if env:
        return env
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "ckptpub", "preload")


def write_json(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (temp file, fsync, rename)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> Any | None:
    """The JSON in ``path``; ``None`` when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def append_decision(state_dir: str, entry: dict[str, Any]) -> None:
    """Append one entry to the decision log (a whole line in one ``write``)."""
    line = (json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")
    fd = os.open(os.path.join(state_dir, DECISIONS), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_decisions(state_dir: str) -> list[dict[str, Any]]:
    """Every complete entry of the decision log, oldest first."""
    try:
        with open(os.path.join(state_dir, DECISIONS), "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return []
    entries = []
    for raw in data.split(b"\n"):
        if raw.strip():
            try:
                entries.append(json.loads(raw))
            except ValueError:
                continue
    return entries


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


def _when(stamp: float | None, now: float) -> str:
    if not stamp:
        return "-"
    text = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
    return f"{text} ({_ago(now - stamp)})"


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
        f"supervisor: pid {status.get('supervisor_pid', '?')} ({alive}), updated {_when(status.get('updated'), now)}",
        f"held:       {held.get('identity') or '(nothing)'}",
    ]
    if held:
        lines += [
            f"  since:    {_when(held.get('since'), now)}",
            f"  folder:   {held.get('folder')}",
            f"  pid:      {held.get('pid')}" + ("" if held.get("alive", True) else " (exited)"),
            f"  sockets:  {held.get('socket_dir')}",
        ]
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
    return "\n".join(lines)
