"""``ckptpub preload``: the command (an entry point of the ``ckptpub.commands`` group).

    ckptpub preload MODEL_DIR [options] [-- extra args for vllm preload]
    ckptpub preload --follow RUN_DIR [--verified-only] [options] [-- extra args]
    ckptpub preload --status [--state-dir DIR] [--json]

Exit codes: 0 ok (the supervisor stopped on SIGTERM/SIGINT; ``--status``: the daemon
holds the target's identity), 1 ``--status`` found no daemon holding the target
(failed, loading, no target, stopped), 2 unusable input or usage. Every error is one
line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
from collections.abc import Sequence

from . import status as st
from .daemon_process import DEFAULT_COMMAND, IDENTITY_PATTERN, READY_PATTERN

EXIT_OK, EXIT_MISMATCH, EXIT_UNUSABLE = 0, 1, 2


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit code 2, no usage dump
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="ckptpub preload",
        description="Keep vLLM's weight-cache daemon holding exactly the checkpoint you serve: "
        "re-preload when (and only when) the target's manifest identity changes.",
        epilog="Arguments after '--' are passed to the daemon command (default: vllm preload). "
        "Placeholders in --daemon-cmd: {folder}, {socket_dir}, {identity}, {python}.",
    )
    p.add_argument(
        "model_dir",
        nargs="?",
        metavar="MODEL_DIR",
        help="checkpoint folder to serve (a symlink is followed on every poll)",
    )
    p.add_argument("--follow", metavar="RUN_DIR", help="serve the newest published step of a training run")
    p.add_argument(
        "--verified-only",
        action="store_true",
        help="only preload checkpoints that pass 'ckptpub verify' (a full re-hash, once per publish)",
    )
    p.add_argument(
        "--daemon-cmd",
        default=DEFAULT_COMMAND,
        metavar="CMD",
        help=f"daemon command template (default: {DEFAULT_COMMAND!r})",
    )
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        help=f"status, decision log, daemon logs (default: "
        f"${st.STATE_DIR_ENV} or ~/.local/state/ckptpub/preload)",
    )
    p.add_argument(
        "--interval", type=float, default=5.0, metavar="S", help="seconds between polls (default 5)"
    )
    p.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="stop the old daemon before loading the new one (when two models do not fit)",
    )
    p.add_argument(
        "--socket-dir",
        metavar="DIR",
        help="fixed weight-cache socket directory for every daemon (implies --one-at-a-time); "
        "default: a fresh directory per daemon under the state directory",
    )
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=1800.0,
        metavar="S",
        help="give up on a daemon not ready after S seconds (default 1800)",
    )
    p.add_argument(
        "--stop-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="SIGKILL a daemon still running S seconds after SIGTERM (default 60)",
    )
    p.add_argument(
        "--retry-delay",
        type=float,
        default=30.0,
        metavar="S",
        help="first back-off after a failed preload, doubled per failure (default 30)",
    )
    p.add_argument(
        "--identity-pattern",
        default=IDENTITY_PATTERN,
        metavar="REGEX",
        help="log line by which a daemon reports its identity (group 'identity')",
    )
    p.add_argument(
        "--ready-pattern",
        default=READY_PATTERN,
        metavar="REGEX",
        help="log line by which a daemon reports it is ready",
    )
    p.add_argument("--quiet", action="store_true", help="do not echo decisions on stderr")
    p.add_argument("--status", action="store_true", help="print what the supervisor holds and why, then exit")
    p.add_argument(
        "--json", action="store_true", help="with --status: print status.json (plus supervisor_alive)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    try:
        args = _parser().parse_args(argv)
        if args.status:
            return _status(args)
        return _supervise(args, extra)
    except _UsageError as error:
        _fail(f"{error} (see 'ckptpub preload --help')")
        return EXIT_UNUSABLE
    except KeyboardInterrupt:
        _fail("interrupted")
        return 130
    except Exception as error:  # noqa: BLE001 - one line, never a traceback
        known = type(error).__name__ == "CkptpubError" or isinstance(
            error, (RuntimeError, ValueError, OSError)
        )
        _fail(str(error) if known else f"internal error: {type(error).__name__}: {error}")
        return EXIT_UNUSABLE


def _fail(message: str) -> None:
    print(f"ckptpub preload: error: {' '.join(str(message).split())}", file=sys.stderr)


def _supervise(args: argparse.Namespace, extra: list[str]) -> int:
    import re

    import ckptpub

    from .supervisor import Config, Supervisor

    if bool(args.model_dir) == bool(args.follow):
        raise _UsageError("give exactly one of MODEL_DIR or --follow RUN_DIR")
    for name in ("interval", "ready_timeout", "stop_timeout", "retry_delay"):
        if getattr(args, name) <= 0:
            raise _UsageError(f"--{name.replace('_', '-')} must be positive")
    for name in ("identity_pattern", "ready_pattern"):
        try:
            compiled = re.compile(getattr(args, name))
        except re.error as error:
            raise _UsageError(f"--{name.replace('_', '-')}: {error}") from None
        if name == "identity_pattern" and not compiled.groups:
            raise _UsageError(
                "--identity-pattern needs a group that captures the identity: (?P<identity>...)"
            )
    if args.follow:
        if not os.path.isdir(args.follow):
            raise _UsageError(f"--follow {args.follow}: not a directory")
    else:
        if not os.path.isdir(args.model_dir):
            raise _UsageError(f"{args.model_dir}: not a directory")
        ckptpub.read_manifest(args.model_dir)  # CkptpubError: no/invalid manifest -> exit 2
    if "{folder}" not in args.daemon_cmd:
        raise _UsageError("--daemon-cmd must contain {folder}")
    if any(a == "--weight-cache-socket-dir" or a.startswith("--weight-cache-socket-dir=") for a in extra):
        raise _UsageError("pass the socket directory as --socket-dir (before '--'), not to vllm preload")
    config = Config(
        model_dir=os.path.abspath(args.model_dir) if args.model_dir else None,
        follow=os.path.abspath(args.follow) if args.follow else None,
        verified_only=args.verified_only,
        daemon_cmd=args.daemon_cmd,
        extra=extra,
        state_dir=args.state_dir or st.default_state_dir(),
        interval=args.interval,
        one_at_a_time=args.one_at_a_time,
        socket_dir=os.path.abspath(args.socket_dir) if args.socket_dir else None,
        ready_timeout=args.ready_timeout,
        stop_timeout=args.stop_timeout,
        retry_delay=args.retry_delay,
        identity_pattern=args.identity_pattern,
        ready_pattern=args.ready_pattern,
        quiet=args.quiet,
    )
    return Supervisor(config).run()


def supervisor_alive(state_dir: str) -> bool:
    """Whether a supervisor holds the state directory's lock right now."""
    try:
        fd = os.open(os.path.join(state_dir, st.LOCK), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _status(args: argparse.Namespace) -> int:
    state_dir = args.state_dir or st.default_state_dir()
    data = st.read_json(os.path.join(state_dir, st.STATUS))
    if not isinstance(data, dict):
        _fail(f"{state_dir}: no status (has a supervisor run with this --state-dir?)")
        return EXIT_UNUSABLE
    data["supervisor_alive"] = supervisor_alive(state_dir)
    if not data["supervisor_alive"] and data.get("state") not in ("stopped",):
        data["state_note"] = "the supervisor is not running; this status may be stale"
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(st.format_status(data))
        if data.get("state_note"):
            print(f"note:       {data['state_note']}")
    held = data.get("held") or {}
    target = data.get("target") or {}
    good = (
        data["supervisor_alive"]
        and data.get("state") == "ready"
        and held.get("alive", True)
        and held.get("identity")
        and held.get("identity") == target.get("identity")
    )
    return EXIT_OK if good else EXIT_MISMATCH
