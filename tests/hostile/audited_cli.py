"""Run the ckptpub CLI with an audit hook that records every path it opens or lists.

Usage: python audited_cli.py LOG_FILE ckptpub-args...
All ckptpub modules are imported before the hook is installed, so the log holds
only what the command itself touched: the tests check that it stays in the folder.
"""

import json
import os
import sys

import ckptpub.cli
import ckptpub.compare
import ckptpub.publishing
import ckptpub.read  # noqa: F401  (imported before auditing starts)

touched: list[str] = []
# Imports the standard library does lazily (locale, encodings) open files under these; they are not the command's reads.
_INTERPRETER = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(ckptpub.__file__)))})


def hook(event: str, args: tuple) -> None:
    if event in ("open", "os.scandir", "os.listdir") and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if not os.path.realpath(path).startswith(_INTERPRETER):
            touched.append(path)


def main() -> None:
    log = sys.argv[1]
    sys.addaudithook(hook)
    code = ckptpub.cli.main(sys.argv[2:])
    sys.stdout.flush()
    with open(log, "w") as handle:
        json.dump(touched[:-1] if touched and touched[-1] == log else touched, handle)
    sys.exit(code)


main()
