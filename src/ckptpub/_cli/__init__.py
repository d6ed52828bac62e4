"""The command line: ``ckptpub publish|verify|show|diff|ls|log`` and the commands plugins add.

The public face is ``ckptpub.cli`` (``main``, ``run``, ``Command``, ``ExitCode``,
``UsageError``); these are its private modules.

Modules (imports go downwards only; from outside this package any lower layer):

    main       argparse, the built-in commands, ``main(argv) -> exit code``, entry-point commands
    printing   what the commands print: lines for people, dicts for ``--json``, all escaped
    progress   the progress bar on stderr
"""
