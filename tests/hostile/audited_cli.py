"""Run one ckptpub verb with an audit hook that records every path it opens or lists.

Each record is ``[path, nofollow]``: with ``O_NOFOLLOW`` the kernel does not follow
a symlink in the last component, so what was reached is the parent's real path plus
that name (a symlink there makes the open fail instead of leaving the folder).

Usage: python audited_cli.py LOG_FILE cli|api VERB ARGS...

``cli`` runs ``ckptpub.cli.main``; ``api`` runs the same verb through the Python
API (``publish``, ``verify``, ``read_manifest``, ``diff_manifests``) and reports the
outcome the way the CLI would (exit 0/1/2, one ``ckptpub: error:`` line for a
``CkptpubError``), so the tests hold both entry points to the same promises. Any
other exception from the API is printed with its traceback and exits 3.
All ckptpub modules are imported before the hook is installed, so the log holds
only what the command itself touched: the tests check that it stays in the folder.
"""

import json
import os
import sys
import traceback

import ckptpub
import ckptpub._filesystem.read
import ckptpub._operations.publishing
import ckptpub._operations.verify  # noqa: F401  (imported before auditing starts)
import ckptpub.cli

touched: list[str] = []
# Imports the standard library does lazily (locale, encodings) open files under these;
# they are not the command's reads.
_INTERPRETER = tuple(
    {
        os.path.realpath(p) + os.sep
        for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(ckptpub.__file__)))
    }
)


def hook(event: str, args: tuple) -> None:
    if (
        event in ("open", "os.scandir", "os.listdir")
        and args
        and isinstance(args[0], (str, bytes, os.PathLike))
    ):
        path = os.fsdecode(args[0])
        if not os.path.realpath(path).startswith(_INTERPRETER):
            flags = args[2] if event == "open" and len(args) > 2 and isinstance(args[2], int) else 0
            touched.append([path, bool(flags & os.O_NOFOLLOW)])


def run_api(verb: str, args: list[str]) -> int:
    try:
        if verb == "publish":
            print(ckptpub.publish(args[0]).identity)
            return 0
        if verb == "verify":
            expect = args[args.index("--expect-identity") + 1] if "--expect-identity" in args else None
            return 0 if ckptpub.verify(args[-1], expect_identity=expect).ok else 1
        if verb == "show":
            print(ckptpub.read_manifest(args[0]).identity)
            return 0
        if verb == "diff":
            return (
                0
                if ckptpub.diff_manifests(ckptpub.read_manifest(args[0]), ckptpub.read_manifest(args[1])).same
                else 1
            )
        raise SystemExit(f"no API for {verb}")
    except ckptpub.CkptpubError as error:
        print(f"ckptpub: error: {error}", file=sys.stderr)
        return 2
    except Exception:  # the failure the tests look for: not a CkptpubError
        traceback.print_exc()
        return 3


def main() -> None:
    log, entry, verb, *args = sys.argv[1:]
    sys.addaudithook(hook)
    code = ckptpub.cli.main([verb, *args]) if entry == "cli" else run_api(verb, args)
    sys.stdout.flush()
    with open(log, "w") as handle:
        json.dump(touched[:-1] if touched and touched[-1][0] == log else touched, handle)
    sys.exit(code)


main()
