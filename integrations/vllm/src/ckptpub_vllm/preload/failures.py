"""Which daemon failures cannot succeed on retry.

A preload that failed is retried with back-off (``supervisor``), which heals what
changes by itself: memory taken by another process, a folder re-published while it
loaded, a signature landing after its manifest. Some failures come from the machine
or the command line and come back on every retry, forever; for those the supervisor
stops with exit 2 and one line instead:

* the daemon cannot import what it needs (``ModuleNotFoundError``, ``ImportError``);
* the platform cannot share weights with engines (vLLM's
  ``UnsupportedPlatformForIPCError``: no CUDA IPC);
* ``vllm preload`` refused its arguments (an argparse usage error, exit code 2).

They are read from the daemon's log once it has exited before it was ready: the
last exception summary line (``Name: message``, a traceback's last line), or the
usage error's line.
"""

from __future__ import annotations

import re

#: vLLM prefixes what its child processes print with ``(name pid=N) ``.
_PROCESS_PREFIX = re.compile(r"^\([\w.-]+ pid=\d+\) ")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?P<name>[A-Za-z_]\w*(?:Error|Exception)): (?P<message>.*)$")
_USAGE = re.compile(r"^[\w. -]+: error: (?P<message>.+)$")
USAGE = "usage error"
#: Exception names whose failure comes back on every retry, and what they mean.
_PERMANENT = {
    "ModuleNotFoundError": "the daemon cannot import what it needs",
    "ImportError": "the daemon cannot import what it needs",
    "UnsupportedPlatformForIPCError": "this platform cannot share weights with engines",
}
MAX_CHARS = 300


def exception_line(line: str) -> str | None:
    """``Name: message`` when ``line`` ends a traceback or is a usage error, else None."""
    text = _PROCESS_PREFIX.sub("", line.strip())
    match = _EXCEPTION.match(text)
    if match is not None:
        return f"{match['name']}: {match['message']}"[:MAX_CHARS]
    usage = _USAGE.match(text)
    if usage is not None:
        return f"{USAGE}: {usage['message']}"[:MAX_CHARS]
    return None


def permanent_reason(last_exception: str | None, exit_code: int | None) -> str | None:
    """Why a daemon that exited this way cannot succeed on retry, or None when a retry may heal it."""
    if last_exception is None:
        return None
    name, _, message = last_exception.partition(": ")
    if name == USAGE and exit_code == 2:
        return f"vllm preload refused its arguments: {message}"
    meaning = _PERMANENT.get(name)
    return f"{meaning}: {last_exception}" if meaning else None
