"""The one error an engine raises when it will not serve a checkpoint, in the one wording.

Whatever its reason (a tensor, a shard, an engine file, the manifest, a pin, a
signature), a refusal reads ``ckptpub: refusing to serve FOLDER: REASON``, then how many
more problems were found and what to run: one line, readable at the bottom of an
engine's failure log, in scripts, and in the one log line an integration writes. An
adapter's reads ``ckptpub: refusing to serve adapter FOLDER: REASON``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import CkptpubError, and_more


class RefusedError(CkptpubError):
    """A checkpoint an engine must not serve: it differs from its manifest, or has none where one is required.

    ``folder`` is what was asked for (empty when not known, as for a refusal relayed from
    another process), ``reason`` the first problem, ``kind`` what the folder holds
    (``adapter``; a model when empty).
    """

    def __init__(self, folder: str, reason: str, *, more: int = 0, hint: str = "", kind: str = "") -> None:
        self.folder = folder
        self.reason = reason
        self.kind = kind
        subject = f"{kind} {folder}" if kind else folder
        text = and_more(f"ckptpub: refusing to serve {subject}: {reason}", more)
        super().__init__(f"{text}; {hint}" if hint else text)

    @classmethod
    def for_problems(
        cls, folder: str, problems: Sequence[str], hint: str = "", kind: str = ""
    ) -> RefusedError:
        """The refusal for the first of ``problems`` (not empty), counting the rest."""
        return cls(folder, problems[0], more=len(problems) - 1, hint=hint, kind=kind)

    @classmethod
    def relayed(cls, line: str) -> RefusedError:
        """A refusal raised in another process of the engine, raised again from its one line.

        Its ``reason`` is that whole line; its ``folder`` is not known here (empty).
        """
        error = cls.__new__(cls)
        CkptpubError.__init__(error, line)
        error.folder, error.reason, error.kind = "", line, ""
        return error
