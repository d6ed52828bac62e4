"""The one error the plugin raises when it will not serve a checkpoint.

A subclass of ``RuntimeError`` so vLLM treats it like any other load failure. Every
refusal reads the same, whatever its reason (a tensor, a shard, an engine file, the
manifest, a pin): one line, ``ckptpub: refusing to serve FOLDER: REASON``, then how
many more problems were found and what to run, so it is readable at the bottom of
vLLM's engine-failure log, in scripts, and in the one log line the loader writes.
"""

from __future__ import annotations

from collections.abc import Sequence

from ckptpub.errors import and_more


class RefusedError(RuntimeError):
    """The checkpoint does not match its manifest (or has none where one is required)."""

    def __init__(self, folder: str, reason: str, *, more: int = 0, hint: str = "") -> None:
        self.folder = folder
        self.reason = reason
        text = and_more(f"ckptpub: refusing to serve {folder}: {reason}", more)
        if hint:
            text += f"; {hint}"
        # One line whatever a path holds; everything else is kept exactly.
        super().__init__(text.replace("\r", "\\r").replace("\n", "\\n"))

    @classmethod
    def for_problems(cls, folder: str, problems: Sequence[str], hint: str = "") -> RefusedError:
        """The refusal for the first of ``problems`` (not empty), counting the rest."""
        return cls(folder, problems[0], more=len(problems) - 1, hint=hint)

    @classmethod
    def relayed(cls, folder: str, message: str) -> RefusedError:
        """The refusal another process (an engine worker) made, raised again with its very words."""
        error = cls(folder, message)
        error.args = (message.replace("\r", "\\r").replace("\n", "\\n"),)
        return error
