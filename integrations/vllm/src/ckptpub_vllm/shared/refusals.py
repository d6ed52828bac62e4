"""Refusals (``ckptpub.serving.RefusedError``) logged in their own words, and relayed, before vLLM wraps them.

Every refusal reads the same, whatever its reason: one line, ``ckptpub: refusing to
serve FOLDER: REASON``, then how many more problems were found and what to run (the
core's ``RefusedError``). vLLM re-raises a loader's error as a worker traceback or a generic
"Engine core initialization failed", so the plugin logs the line itself in the process
that refused (a worker, a daemon) and relays it to the process that started the engine
(``frontend``): the engine process appends the line to the file that process names in
``CKPTPUB_REFUSAL_FILE`` (:func:`relay`), and that process reads it back
(:func:`relayed_refusal`). Both ends of that file are here, so its format lives in one place.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

from ckptpub.errors import CkptpubError
from ckptpub.integration import REFUSAL_FILE_ENV
from ckptpub.serving import RefusedError

from .log import logger

#: A refusal is one line; a relay file larger than this is not read further.
MAX_RELAY_BYTES = 64 << 10


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


def relay(error: RefusedError) -> None:
    """In an engine process: hand ``error`` to the process that started the engine, if it asked."""
    path = os.environ.get(REFUSAL_FILE_ENV)
    if not path:
        return
    line = json.dumps({"message": str(error)}) + "\n"
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.write(fd, line.encode("utf-8", "backslashreplace"))
        finally:
            os.close(fd)


def relayed_refusal() -> RefusedError | None:
    """The first refusal an engine process relayed since this engine started, if any."""
    path = os.environ.get(REFUSAL_FILE_ENV)
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_RELAY_BYTES)
    except OSError:
        return None
    for raw in data.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("message"), str):
            return RefusedError.relayed(entry["message"])
    return None
