"""What the plugin adds to vLLM's weight-cache daemon while it serves, in daemon processes only.

``daemon.run_daemon`` installs this in each daemon process, on vLLM's
``WeightCacheDaemon`` class. vLLM's own serving is unchanged (the socket is bound
after loading and warm-up, the per-GPU ``flock`` on ``<socket>.lock``, the owner
checks, the pickle protocol); around it:

* **Reports** (``daemon_reports``): the identity the daemon's key holds when it takes
  its socket path, each engine process it hands the weights to (its pid, from
  ``SO_PEERCRED``), each ``release`` of a ``copy``-mode engine.
* **Taking over a socket path** (only with ``CKPTPUB_PRELOAD_TAKEOVER=1``, which
  ``ckptpub preload`` sets): vLLM's daemon fails at once when another daemon holds the
  lock. Here it reports ``waiting`` instead, once loaded and warmed up, and takes the
  lock as soon as the holder lets it go; ``ckptpub preload`` then asks the old daemon
  to hand the path over. Engines with no socket option (vLLM's default path) so
  always find the newest confirmed daemon, and the new one loads while the old serves.
* **Two requests of ckptpub's own**, answered on the daemon's socket before vLLM's
  handler sees anything: ``ckptpub_held`` (the key the daemon holds, so an engine
  told "mismatch" can name both identities) and ``ckptpub_hand_over`` (stop serving
  the socket path: vLLM's loop ends through its ``finally``, which closes the server
  socket, removes its own socket file and releases the lock; the process keeps its
  weights, which ``zero_copy`` engines map, until it is stopped). A hand-over names
  the daemon process it is for, and any other refuses it: the request goes to a
  path, and by the time it arrives the path may belong to the daemon that took over.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from ckptpub.integration import PRELOAD_TAKEOVER_ENV, env_flag

from ..shared import daemon_reports
from ..shared.daemon_reports import (
    CLIENT,
    HAND_OVER_COMMAND,
    HANDED_OVER,
    HELD_COMMAND,
    RELEASED,
    SERVING,
    WAITING,
    start_ticks,
)
from ..shared.log import logger

#: How often a daemon waiting to take over a socket path tries its lock again.
LOCK_RETRY_S = 0.1
_PATCHED = "_ckptpub_serving"


class HandOver(BaseException):
    """Raised out of vLLM's serve loop when ``ckptpub preload`` asks the daemon to hand its path over.

    A ``BaseException``, so vLLM's loop, which reports and survives every ``Exception``
    of a request, lets it through to its ``finally``. It carries the daemon, whose
    weights must stay alive for the engines that mapped them.
    """

    def __init__(self, daemon: Any, socket_path: str) -> None:
        super().__init__(f"handed over {socket_path}")
        self.daemon = daemon
        self.socket_path = socket_path


def takeover_from_env() -> bool:
    """Whether ``ckptpub preload`` started this daemon to take over a socket path (the core's flag rule)."""
    return env_flag(PRELOAD_TAKEOVER_ENV)


def held_key(daemon: Any) -> Any:
    """The daemon's ``WeightCacheKey`` (vLLM 0.32 ``cache_config``, 0.33 ``cache_key``)."""
    held = getattr(daemon, "cache_config", None)
    return held if held is not None else daemon.cache_key


def peer_pid(conn: Any) -> int | None:
    """The pid of the process at the other end of a Unix socket (Linux ``SO_PEERCRED``)."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    pid: int = struct.unpack("3i", creds)[0]
    return pid or None


class _Frame:
    """Collects what vLLM's ``send_msg`` writes: a request framed exactly as its ``recv_msg`` reads it."""

    def __init__(self) -> None:
        self.data = b""

    def sendall(self, data: bytes) -> None:
        self.data += data


class _Replayed:
    """A connection whose first request, already read, is read again by vLLM's handler.

    The request is framed by vLLM's own ``send_msg`` into a buffer that ``recv`` hands
    out first; everything else (replies included) goes to the real connection.
    """

    def __init__(self, conn: Any, request: Any, send_msg: Callable[[Any, Any], None]) -> None:
        frame = _Frame()
        send_msg(frame, request)
        self._conn = conn
        self._pending = frame.data

    def recv(self, size: int) -> bytes:
        if not self._pending:
            data: bytes = self._conn.recv(size)
            return data
        chunk, self._pending = self._pending[:size], self._pending[size:]
        return chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def install() -> None:
    """Wrap ``WeightCacheDaemon``'s lock, connection, state and release handlers (idempotent)."""
    from vllm.model_executor.model_loader.weight_cache import daemon as vllm_daemon
    from vllm.model_executor.model_loader.weight_cache import protocol

    cls = vllm_daemon.WeightCacheDaemon
    if getattr(cls, _PATCHED, False):
        return
    acquire_lock = cls._acquire_gpu_lock
    handle_connection = cls._handle_connection
    handle_get_state = cls._handle_get_state
    handle_release = cls._handle_release

    def _acquire_gpu_lock(self: Any, socket_path: str) -> int:
        identity = held_key(self).checkpoint
        try:
            fd: int = acquire_lock(self, socket_path)
        except protocol.WeightCacheUnavailableError:
            if not takeover_from_env():
                raise
            daemon_reports.report(WAITING, identity=identity, socket=socket_path)
            while True:
                time.sleep(LOCK_RETRY_S)
                try:
                    fd = acquire_lock(self, socket_path)
                    break
                except protocol.WeightCacheUnavailableError:
                    continue
        daemon_reports.report(SERVING, identity=identity, socket=socket_path)
        return fd

    def _handle_connection(self: Any, conn: Any) -> None:
        request = protocol.recv_msg(conn)
        command = request.get("cmd") if isinstance(request, dict) else None
        if command == HELD_COMMAND:
            protocol.send_msg(
                conn,
                {
                    "status": "ok",
                    "key": dataclasses.asdict(held_key(self)),
                    "folder": self.model_config.model,
                    "released": self.model is None,
                },
            )
        elif command == HAND_OVER_COMMAND:
            asked = request.get("pid")
            mine = asked == os.getpid()  # else meant for the daemon that held this path before us
            reply = {"status": "ok"}
            if not mine:
                logger.warning(
                    "ckptpub: a hand-over of %s asked of daemon pid %s reached pid %d, which keeps serving",
                    self._socket_path,
                    asked,
                    os.getpid(),
                )
                reply = {"status": "error", "message": f"this daemon is pid {os.getpid()}"}
            with contextlib.suppress(OSError):  # the asker left: answer as if it had stayed
                protocol.send_msg(conn, reply)
            if mine:
                raise HandOver(self, self._socket_path)
        else:
            handle_connection(self, _Replayed(conn, request, protocol.send_msg))

    def _handle_get_state(self: Any, conn: Any, request: dict[str, Any]) -> None:
        asked = request.get("cache_config", request.get("cache_key"))
        served = (
            self.model is not None
            and isinstance(asked, protocol.WeightCacheKey)
            and not held_key(self).mismatched_fields(asked)
        )
        handle_get_state(self, conn, request)
        pid = peer_pid(conn) if served else None
        if pid is not None:
            daemon_reports.report(CLIENT, client_pid=pid, client_start=start_ticks(pid))

    def _handle_release(self: Any, conn: Any) -> None:
        handle_release(self, conn)
        daemon_reports.report(RELEASED, client_pid=peer_pid(conn))

    cls._acquire_gpu_lock = _acquire_gpu_lock
    cls._handle_connection = _handle_connection
    cls._handle_get_state = _handle_get_state
    cls._handle_release = _handle_release
    setattr(cls, _PATCHED, True)


def keep_weights_for_mapped_engines(handed: HandOver) -> None:
    """After a hand-over: report it, and keep the weights (``zero_copy`` engines map them) until stopped.

    ``ckptpub preload`` stops this process (``SIGTERM``, whose default action ends it)
    once no engine that was handed the weights is still running.
    """
    daemon_reports.report(HANDED_OVER, socket=handed.socket_path, identity=held_key(handed.daemon).checkpoint)
    while True:
        signal.pause()
