"""The ``ckptpub`` command's entry point (and ``python -m ckptpub``'s), apart from the CLI it runs.

Importing the CLI (argparse, the modules of every command) is most of a small
command's start-up, and a Ctrl-C that landed meanwhile ended in a ``KeyboardInterrupt``
traceback from the import. So nothing of ckptpub is imported at this module's top
(``import ckptpub`` imports nothing either): :func:`main` imports the CLI inside the
same handling every later moment of a run gets, exit 130 and ``ckptpub: error:
interrupted``. What is left is the interpreter's own start-up, before any ckptpub code.
"""

from __future__ import annotations

import os

from . import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import NoReturn

#: The exit status of a run that Ctrl-C ended, as a shell reports SIGINT (``cli.ExitCode.INTERRUPTED``).
INTERRUPTED = 130


def main() -> NoReturn:
    """Import the CLI and run it (``cli.run``); Ctrl-C during the import ends the run as it would later."""
    try:
        from .cli import run
    except KeyboardInterrupt:
        _interrupted()
    run()


def _interrupted() -> NoReturn:
    """End the process as an interrupted command: one line on stderr (if it can take it), exit 130."""
    try:  # noqa: SIM105 - contextlib is one import more in the start-up this module keeps short
        os.write(2, b"ckptpub: error: interrupted\n")
    except OSError:
        pass
    os._exit(INTERRUPTED)
