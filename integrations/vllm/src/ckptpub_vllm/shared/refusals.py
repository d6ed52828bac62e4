"""Refusals (``ckptpub.serving.RefusedError``) logged in their own words, and relayed, before vLLM wraps them.

Every refusal reads the same, whatever its reason: one line, ``ckptpub: refusing to
serve FOLDER: REASON``, then how many more problems were found and what to run (the
core's ``RefusedError``). vLLM re-raises a loader's error as a worker traceback or a generic
"Engine core initialization failed", so the plugin logs the line itself in the process
that refused (a worker, a daemon) and relays it to the process that started the engine
(``frontend``): that process makes a new relay file for each engine start, in a folder
of its own (:func:`start_relay`), and names it in ``CKPTPUB_REFUSAL_FILE``; the engine
process appends the line to it (:func:`relay`), and the starting process reads it back
(:func:`relayed_refusal`) and forgets it once the engine started (:func:`end_relay`).
A name is never reused and no inherited name is ever made or emptied, and every open of
the file is :mod:`.own_files`'s (no symlink followed, no FIFO blocked on), so a symlink
planted at the name, or the variable naming one, never leads a write elsewhere. Both
ends of that file are here, so its format lives in one place.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import tempfile
from collections.abc import Iterator

from ckptpub.errors import CkptpubError
from ckptpub.integration import REFUSAL_FILE_ENV
from ckptpub.serving import RefusedError

from .log import logger
from .own_files import APPEND_EXISTING, CREATE, open_own, read_own

#: A refusal is one line; a relay file larger than this is not read further.
MAX_RELAY_BYTES = 64 << 10
RELAY_NAME = "refusals.jsonl"

#: The relay file this process made for the engine starting now, if any (only it is ever removed).
_current: list[str] = []


@contextlib.contextmanager
def refusals_logged(folder: str | None = None) -> Iterator[None]:
    """Log a refusal once, in its own words, before vLLM wraps it.

    This line is what an operator reads in the log. It is also relayed to the process
    that started the engine (``frontend``), which raises it there. With the ``folder``
    being served, a ``CkptpubError`` that reaches here from any check (of the manifest,
    its tables, a shard) is a refusal like every other, in the same words, logged and
    relayed the same way.
    """
    try:
        yield
    except RefusedError as error:
        _tell(error)
        raise
    except CkptpubError as error:
        if folder is None:
            raise
        refusal = RefusedError(folder, str(error))
        _tell(refusal)
        raise refusal from None


def _tell(refusal: RefusedError) -> None:
    """The refusal's one line in the log and to the process that started the engine."""
    logger.error("%s", refusal)
    relay(refusal)


def start_relay() -> None:
    """In the process that starts an engine: a new, empty relay file for its engine processes.

    Made exclusively in a new private folder (``mkdtemp``: mode 0700, a fresh name), so
    no other user can plant anything at its name, and named in the environment the
    engine processes inherit. Removed by :func:`end_relay`, or at exit.
    """
    end_relay()
    folder = tempfile.mkdtemp(prefix="ckptpub-refusal-")
    path = os.path.join(folder, RELAY_NAME)
    os.close(open_own(path, CREATE))
    _current.append(path)
    os.environ[REFUSAL_FILE_ENV] = path
    atexit.unregister(end_relay)  # once, however many engines start: at exit only what is current goes
    atexit.register(end_relay)


def end_relay() -> None:
    """The engine started (or failed to): remove its relay file and its name from the environment.

    Refusals after the start (adapters) are the requests'; the next start makes a new file.
    """
    while _current:
        path = _current.pop()
        if os.environ.get(REFUSAL_FILE_ENV) == path:
            del os.environ[REFUSAL_FILE_ENV]
        _remove(path)


def _remove(path: str) -> None:
    """Remove a relay file :func:`start_relay` made, and its folder."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(path))


def relay(error: RefusedError) -> None:
    """In an engine process: hand ``error`` to the process that started the engine, if it asked.

    Appended to the file that process made: nothing is made here, and a symlink, a FIFO or
    anything but a regular file at the name is left alone.
    """
    path = os.environ.get(REFUSAL_FILE_ENV)
    if not path:
        return
    line = json.dumps({"message": str(error)}) + "\n"
    with contextlib.suppress(CkptpubError, OSError):
        fd = open_own(path, APPEND_EXISTING)
        try:
            os.write(fd, line.encode("utf-8", "backslashreplace"))
        finally:
            os.close(fd)


def relayed_refusal() -> RefusedError | None:
    """The first refusal an engine process relayed to the file :func:`start_relay` made, if any."""
    if not _current:
        return None
    try:
        data = read_own(_current[-1], MAX_RELAY_BYTES)
    except CkptpubError:
        return None
    for raw in data.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("message"), str):
            return RefusedError.relayed(entry["message"])
    return None
