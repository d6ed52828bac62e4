"""The shapes of what the supervisor writes (status, decision log, daemon records), checked on reading.

``--status`` and ``--history`` print what they read and the next supervisor adopts
daemons from it, so a file another program, a person or a torn disk changed must be
told apart from what a supervisor wrote before any of it is used: a time of 1e300,
``held`` as a list, ``sockets`` as numbers. Each shape is declared once, here, and
:func:`problem` says the first way a value is not it. Every field may be absent (the
readers show ``?`` or ``-``) and unknown fields are ignored; a field that is there has
the type the supervisor writes, and a time is a number of seconds between the epoch
and the end of year 9999 (what a clock can show).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

#: ``(value, where) -> why it is not the shape, or None``.
Check = Callable[[Any, str], str | None]

#: 9999-12-31 23:59:59 UTC: the last second ``time.strftime`` shows everywhere.
LATEST_TIME = 253402300799.0


def _of_type(kind: type, name: str) -> Check:
    def check(value: Any, where: str) -> str | None:
        if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            return None
        return f"{_at(where)}{_shown(value)} is not {name}"

    return check


STRING = _of_type(str, "a string")
INTEGER = _of_type(int, "an integer")
BOOLEAN = _of_type(bool, "true or false")


def _time(value: Any, where: str) -> str | None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and math.isfinite(value) and 0 <= value <= LATEST_TIME:
        return None
    return f"{_at(where)}{_shown(value)} is not a time"


#: Seconds since the epoch that a clock can show.
TIME: Check = _time


def optional(check: Check) -> Check:
    """``check``, or ``null``."""
    return lambda value, where: None if value is None else check(value, where)


def list_of(check: Check) -> Check:
    def checked(value: Any, where: str) -> str | None:
        if not isinstance(value, list):
            return f"{_at(where)}{_shown(value)} is not a list"
        return next((why for i, item in enumerate(value) if (why := check(item, f"{where}[{i}]"))), None)

    return checked


def record(**fields: Check) -> Check:
    """An object whose ``fields``, where present, have their shapes."""

    def checked(value: Any, where: str) -> str | None:
        if not isinstance(value, dict):
            return f"{_at(where)}{_shown(value)} is not an object"
        for name, check in fields.items():
            if name in value and (why := check(value[name], f"{where}.{name}" if where else name)):
                return why
        return None

    return checked


TARGET = record(
    folder=optional(STRING),
    identity=optional(STRING),
    stamp=optional(list_of(INTEGER)),
    step=optional(INTEGER),
    error=optional(STRING),
    notes=list_of(STRING),
    skipped=list_of(STRING),
)
#: What every record of a daemon holds, as shown and as kept for adoption.
_DAEMON: dict[str, Check] = {
    "identity": STRING,
    "folder": STRING,
    "pid": INTEGER,
    "since": TIME,
    "socket_dir": optional(STRING),
    "generation": INTEGER,
    "log": STRING,
}
#: A daemon as ``status.json`` and the decision log show it (``Supervisor._held_json``).
HELD = record(**_DAEMON, sockets=list_of(STRING), engines=list_of(INTEGER), alive=BOOLEAN)
#: One decision-log line (``Supervisor._record``).
ENTRY = record(
    time=TIME,
    event=STRING,
    action=STRING,
    why=STRING,
    reason=STRING,
    target=TARGET,
    held=optional(HELD),
    daemon=record(pid=INTEGER, identity=STRING, folder=STRING, generation=INTEGER),
)
#: ``status.json`` (``Supervisor._write_status``).
STATUS = record(
    state=STRING,
    supervisor_pid=INTEGER,
    updated=TIME,
    generation=INTEGER,
    mode=STRING,
    follow=optional(STRING),
    model_dir=optional(STRING),
    daemon_cmd=STRING,
    target=optional(TARGET),
    held=optional(HELD),
    loading=optional(HELD),
    retired=list_of(HELD),
    socket_dir=optional(STRING),
    last_decision=optional(ENTRY),
    last_error=optional(STRING),
)
#: ``daemon.json``, ``loading.json`` and each of ``retired.json`` (``Daemon.record``): what adoption reads.
DAEMON_RECORD = record(
    **_DAEMON,
    stamp=optional(list_of(INTEGER)),
    argv=list_of(STRING),
    start_ticks=optional(INTEGER),
    ready_at=optional(TIME),
    log_offset=INTEGER,
)


def problem(shape: Check, value: Any) -> str | None:
    """The first way ``value`` is not ``shape`` (``STATUS``, ``ENTRY``, ...), or None."""
    return shape(value, "")


def _at(where: str) -> str:
    return f"{where}: " if where else ""


def _shown(value: Any) -> str:
    """A value in a message: its JSON type for a container, a short ``repr`` otherwise."""
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "a list"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
