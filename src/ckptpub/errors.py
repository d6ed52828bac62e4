"""The exception types ckptpub raises for input it cannot use.

Every message is a single line that names the file, tensor or manifest field at
fault, because the CLI prints it as is and users act on it without a traceback.
"""

from __future__ import annotations


def one_line(text: str) -> str:
    """``text`` with each unprintable character escaped as ``repr`` would (``\\n``, ``\\t``, ``\\x1b``).

    Everything else is kept exactly: a path with two spaces, or a name in any script,
    still reads as the same path, while a newline or a terminal escape sequence in a
    hostile file name can neither split the line nor reach the terminal.
    """
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class CkptpubError(Exception):
    """Unusable input: a malformed checkpoint or manifest, a missing file, a bad path or argument.

    The CLI maps it to exit code 2. A checkpoint whose bytes differ from a valid
    manifest is not an error but a verification result (see ``VerifyReport``).
    Every public function raises this (never ``TypeError``/``ValueError``) for
    arguments or input it cannot use.
    """

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class NoManifestError(CkptpubError):
    """The folder has no ``ckptpub.json`` at all (nothing at that path).

    Distinct from a manifest that exists but is unusable (a folder, FIFO, symlink,
    too large, malformed), which raises a plain ``CkptpubError``: callers that may
    treat "not published" differently (for instance by refusing with another
    message) can never mistake an unusable manifest for an absent one.
    """


def and_more(text: str, more: int) -> str:
    """``text``, then `` (and N more)`` when ``more`` further items were left unsaid.

    The one wording for "the first problem, and how many others" in messages of
    the CLI, the vLLM plugin and the preload supervisor.
    """
    return f"{text} (and {more} more)" if more > 0 else text
