"""The ``ckptpub`` command line, and what other distributions build their commands with.

``main(argv) -> int`` runs a command line and returns its exit code; ``run()`` is the
console entry point (``ckptpub``, ``python -m ckptpub``). A distribution adds a
command through the ``ckptpub.commands`` entry-point group: each entry point is a
``Command``, whose ``run`` returns an ``ExitCode`` and raises ``UsageError`` for a
command line argparse cannot refuse (``ckptpub preload`` from ckptpub-vllm is one).
``seconds_argument`` is the argparse ``type`` of every duration option (NaN,
infinities, zero and negative values refused). The implementation is ``ckptpub._cli``.
"""

from ._cli.main import COMMANDS_GROUP, Command, ExitCode, UsageError, main, run, seconds_argument

__all__ = ["COMMANDS_GROUP", "Command", "ExitCode", "UsageError", "main", "run", "seconds_argument"]
