"""The one error the plugin raises when it will not serve a checkpoint.

A subclass of ``RuntimeError`` so vLLM treats it like any other load failure. Every
refusal reads the same, whatever its reason (a tensor, a shard, an engine file, the
manifest, a pin): one line, ``ckptpub: refusing to serve FOLDER: REASON``, then how
many more problems were found and what to run, so it is readable at the bottom of
vLLM's engine-failure log, in scripts, and in the one log line the loader writes.
An adapter's refusal reads ``ckptpub: refusing to serve adapter FOLDER: REASON``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from ckptpub.errors import CkptpubError, and_more, one_line

from .log import logger


class RefusedError(RuntimeError):
    """The checkpoint does not match its manifest (or has none where one is required)."""

    def __init__(self, folder: str, reason: str, *, more: int = 0, hint: str = "", kind: str = "") -> None:
        self.folder = folder
        self.reason = reason
        self.kind = kind
        subject = f"{kind} {folder}" if kind else folder
        text = and_more(f"ckptpub: refusing to serve {subject}: {reason}", more)
        if hint:
            text += f"; {hint}"
        # One line whatever a path holds, no control character reaching a terminal; the rest kept exactly.
        super().__init__(one_line(text))

    @classmethod
    def for_problems(
        cls, folder: str, problems: Sequence[str], hint: str = "", kind: str = ""
    ) -> RefusedError:
        """The refusal for the first of ``problems`` (not empty), counting the rest."""
        return cls(folder, problems[0], more=len(problems) - 1, hint=hint, kind=kind)

    @classmethod
    def relayed(cls, line: str) -> RefusedError:
        """A refusal raised in another vLLM process, re-raised from its one line.

        Its ``reason`` is that whole line; its ``folder`` is not known here (empty).
        """
        error = cls.__new__(cls)
        RuntimeError.__init__(error, one_line(line))
        error.folder, error.reason, error.kind = "", line, ""
        return error


@contextlib.contextmanager
def refusals_logged(folder: str | None = None) -> Iterator[None]:
    """Log a refusal once, in its own words, before vLLM wraps it.

    vLLM re-raises a loader's error as a worker traceback or a generic "Engine core
    initialization failed"; this line is what an operator reads in the log. It is also
    relayed to the process that started the engine (``frontend``), which raises it there.
    With the ``folder`` being served, a ``CkptpubError`` that reaches here from any check
    (of the manifest, its entries, a shard) is a refusal like every other, in the same
    words, logged and relayed the same way.
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
