"""What a weight-cache daemon says about itself: one structured line, written and read here only.

The plugin's wrapper writes these lines inside each daemon process and
``ckptpub preload`` reads them from the daemon's log; both import this module, so
the format lives in one place (no sentence written in one module and matched by a
hand-written pattern in another). A report is one line of its own::

    ckptpub-daemon-report {"event": "keyed", "identity": "blake3:...", "pid": 123, ...}

written straight to file descriptor 2 in one ``write`` (so it starts a line whatever
the process's logging does, and lines of several daemon processes sharing a log
file never interleave), JSON after the mark (so paths with any characters stay on
the line). Events and their fields (every report also has ``pid``):

* ``keyed``: ``folder``, ``identity`` (``None``: no manifest, vLLM's own key): the
  manifest this daemon read, once; its key and its load both use that object.
* ``verified``: ``folder``, ``identity``, ``tensors``, ``total``, ``ranks``: every tensor
  loaded matched it; this process hashed ``tensors`` of the identity's ``total``, the
  rest hashed by the other ranks of its node (``ranks`` in all, ``worker.node_share``) that
  agreed on the outcome.
* ``waiting``: ``identity``, ``socket``: loaded and warmed up; another daemon holds
  the socket path, and this one takes it over when that one hands it over.
* ``serving``: ``identity``, ``socket``: this daemon holds the socket path's lock.
* ``client``: ``client_pid``, ``client_start``: an engine process was handed the
  weights (``client_start``: its start time in clock ticks, :func:`start_ticks`, to
  tell a reused pid).
* ``released``: ``client_pid``: an engine in ``copy`` mode no longer needs them.
* ``handed-over``: ``socket``: this daemon stopped serving its socket path and keeps
  its weights only for the engines that mapped them.

``identity`` in ``waiting`` and ``serving`` is the ``checkpoint`` field of the key
the daemon compares engines' keys with, read from vLLM's daemon object itself.
The two requests ckptpub's daemon wrapper answers (``daemon.serving``) are named and
framed here too, for the engine that asks one (``worker.loader``) and the supervisor
that sends the other (``preload.daemon_process``). Nothing here imports vLLM.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import struct
from typing import Any

MARK = "ckptpub-daemon-report"
#: A report longer than this is not one (the longest real one is a few hundred bytes plus a path).
MAX_REPORT_CHARS = 64 << 10

KEYED = "keyed"
VERIFIED = "verified"
WAITING = "waiting"
SERVING = "serving"
CLIENT = "client"
RELEASED = "released"
HANDED_OVER = "handed-over"

_enabled = False

#: Requests the plugin's daemon wrapper answers besides vLLM's own (``get_state``, ...).
HELD_COMMAND = "ckptpub_held"
#: Names the daemon process asked (``pid``): a socket path outlives its daemon, and a request
#: meant for the daemon that held it must not reach the one that took it over.
HAND_OVER_COMMAND = "ckptpub_hand_over"


def enable() -> None:
    """Make :func:`report` write in this process: a daemon's (engines keep their logs free of reports)."""
    global _enabled
    _enabled = True


def report(event: str, **fields: Any) -> None:
    """In a daemon process, write one report line to stderr (fd 2), in one ``write``; elsewhere nothing."""
    if not _enabled:
        return
    line = f"{MARK} {json.dumps({'event': event, 'pid': os.getpid(), **fields}, sort_keys=True)}\n"
    with contextlib.suppress(OSError):  # stderr closed: the daemon serves; ckptpub preload won't confirm it
        os.write(2, line.encode("utf-8", "backslashreplace"))


def command_frame(command: str, **fields: Any) -> bytes:
    """One of ckptpub's requests, framed as vLLM's ``protocol.send_msg`` frames one (``!Q`` size, pickle)."""
    payload = pickle.dumps({"cmd": command, **fields}, protocol=pickle.HIGHEST_PROTOCOL)
    return struct.pack("!Q", len(payload)) + payload


def parse(line: str) -> dict[str, Any] | None:
    """The report on ``line`` (a dict with a string ``event``), or None when the line is not one."""
    if not line.startswith(MARK + " ") or len(line) > MAX_REPORT_CHARS:
        return None
    try:
        data = json.loads(line[len(MARK) + 1 :])
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("event"), str):
        return None
    return data


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


def start_ticks(pid: int) -> int | None:
    """``pid``'s start time in clock ticks since boot (``client_start``), or None when there is none."""
    info = proc_stat(pid)
    return info[1] if info is not None else None
