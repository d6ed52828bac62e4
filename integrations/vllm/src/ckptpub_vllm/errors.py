"""Refusals (``ckptpub.serving.RefusedError``) logged in their own words before vLLM wraps them.

Every refusal reads the same, whatever its reason: one line, ``ckptpub: refusing to
serve FOLDER: REASON``, then how many more problems were found and what to run (the
core's ``RefusedError``). vLLM re-raises a loader's error as a worker traceback or a generic
"Engine core initialization failed", so the plugin logs the line itself and relays it
to the process that started the engine (``frontend``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ckptpub.errors import CkptpubError
from ckptpub.serving import RefusedError

from .log import logger


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
    from .frontend import relay

    logger.error("%s", refusal)
    relay(refusal)
