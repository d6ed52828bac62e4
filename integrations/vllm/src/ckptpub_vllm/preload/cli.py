"""``ckptpub preload``: the command, the ``preload`` entry point of ``ckptpub.commands``.

    ckptpub preload MODEL_DIR [options] [-- extra args for vllm preload]
    ckptpub preload --follow RUN_DIR [--verified-only] [options] [-- extra args]
    ckptpub preload --status [--state-dir DIR] [--json]

``COMMAND`` hands ckptpub its sub-parser, so ``ckptpub preload`` is parsed, helped
and failed like every other ``ckptpub`` command (``ckptpub.cli``). Exit codes
(``ckptpub.cli.ExitCode``): 0 ok (the supervisor stopped on SIGTERM/SIGINT;
``--status``: the daemon holds the target's identity), 1 ``--status`` found no
daemon holding the target (failed, loading, no target, stopped), 2 unusable input or
usage. Every error is one line on stderr, starting ``ckptpub preload:`` like the
supervisor's own log lines.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass

from ckptpub import CkptpubError
from ckptpub.cli import Command, ExitCode, UsageError, seconds_argument
from ckptpub.errors import one_line
from ckptpub.integration import CERTIFICATE_CHAIN_ENV, PRELOAD_STATE_DIR_ENV, PUBLIC_KEY_ENV
from ckptpub.signing import TrustedKey, read_trusted_manifest

from . import start_checks
from . import status as st
from .daemon_process import DEFAULT_COMMAND, READY_PATTERN


@dataclass(frozen=True)
class PreloadArguments:
    """The parsed command line of ``ckptpub preload``; ``extra`` is what followed ``--``."""

    model_dir: str | None
    follow: str | None
    verified_only: bool
    public_key: str | None
    certificate_chain: list[str] | None
    daemon_cmd: str
    state_dir: str | None
    interval: float
    one_at_a_time: bool
    socket_dir: str | None
    ready_timeout: float
    stop_timeout: float
    retry_delay: float
    ready_pattern: str
    quiet: bool
    status: bool
    history: bool
    json: bool
    extra: list[str]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``ckptpub preload``, added to its sub-parser of ckptpub's parser."""
    p.description = (
        "Keep vLLM's weight-cache daemon holding exactly the checkpoint you serve: "
        "re-preload when (and only when) the target's manifest identity changes."
    )
    p.epilog = (
        "Arguments after '--' are passed to the daemon command (default: vllm preload). "
        "Placeholders in --daemon-cmd: {folder}, {socket_dir}, {identity}, {python}."
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
        "--public-key",
        metavar="PUB",
        help=f"only preload checkpoints whose model.sig this key signed (and set ${PUBLIC_KEY_ENV})",
    )
    p.add_argument(
        "--certificate-chain",
        metavar="PEM",
        action="append",
        help=f"as --public-key, trusting certificates this chain vouches for (${CERTIFICATE_CHAIN_ENV})",
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
        f"${PRELOAD_STATE_DIR_ENV} or ~/.local/state/ckptpub/preload)",
    )
    p.add_argument(
        "--interval",
        type=seconds_argument,
        default=5.0,
        metavar="S",
        help="seconds between polls (default 5)",
    )
    p.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="stop the old daemon before loading the new one (when two models do not fit)",
    )
    p.add_argument(
        "--socket-dir",
        metavar="DIR",
        help="weight-cache socket directory of every daemon (engines then need the same socket_dir); "
        "default: vLLM's own, which engines use when given no socket option",
    )
    p.add_argument(
        "--ready-timeout",
        type=seconds_argument,
        default=1800.0,
        metavar="S",
        help="give up on a daemon not ready after S seconds (default 1800)",
    )
    p.add_argument(
        "--stop-timeout",
        type=seconds_argument,
        default=60.0,
        metavar="S",
        help="SIGKILL a daemon still running S seconds after SIGTERM (default 60)",
    )
    p.add_argument(
        "--retry-delay",
        type=seconds_argument,
        default=30.0,
        metavar="S",
        help="first back-off after a failed preload, doubled per failure (default 30)",
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
        "--history", action="store_true", help="print every decision and outcome, oldest first, then exit"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="with --status: print status.json (plus supervisor_alive); with --history: the log's JSON lines",
    )


def run(args: PreloadArguments) -> int:
    """Run the supervisor until SIGTERM/SIGINT, or with ``--status`` report what it holds."""
    if args.status and args.history:
        raise UsageError("give --status or --history, not both")
    if args.history:
        return _history(args)
    return _status(args) if args.status else _supervise(args)


COMMAND = Command(
    "preload",
    "keep vLLM's weight-cache daemon holding exactly the checkpoint you serve",
    PreloadArguments,
    add_arguments,
    run,
    program="ckptpub preload",
    passthrough=True,
)


def _trust(args: PreloadArguments) -> None:
    """``--public-key``/``--certificate-chain`` into the environment: the supervisor's observations read it,
    and every daemon it starts inherits it (the plugin checks the signature in the daemon too)."""
    if args.public_key is not None and args.certificate_chain:
        raise UsageError("give --public-key or --certificate-chain, not both")
    if args.public_key is not None:
        os.environ[PUBLIC_KEY_ENV] = os.path.abspath(args.public_key)
    if args.certificate_chain:
        os.environ[CERTIFICATE_CHAIN_ENV] = os.pathsep.join(
            os.path.abspath(p) for p in args.certificate_chain
        )


def _supervise(args: PreloadArguments) -> int:
    # Imported here, not at the top: ``ckptpub`` imports every command's module to list it,
    # and only this command's run needs the supervisor (no cycle: it does not import this module).
    from .supervisor import Config, Supervisor

    if bool(args.model_dir) == bool(args.follow):
        raise UsageError("give exactly one of MODEL_DIR or --follow RUN_DIR")
    try:
        re.compile(args.ready_pattern)
    except re.error as error:
        raise UsageError(f"--ready-pattern: {error}") from None
    _trust(args)
    socket_dir = os.path.abspath(args.socket_dir) if args.socket_dir else None
    if args.follow:
        if not os.path.isdir(args.follow):
            raise UsageError(f"--follow {args.follow}: not a directory")
    elif args.model_dir:
        if not os.path.isdir(args.model_dir):
            raise UsageError(f"{args.model_dir}: not a directory")
        # CkptpubError: no/invalid (or unsigned) manifest -> exit 2
        start_checks.check_is_a_model(
            args.model_dir, read_trusted_manifest(args.model_dir, TrustedKey.from_environment())
        )
    if any(
        a == "--weight-cache-socket-dir" or a.startswith("--weight-cache-socket-dir=") for a in args.extra
    ):
        raise UsageError("pass the socket directory as --socket-dir (before '--'), not to vllm preload")
    start_checks.check_daemon_command(args.daemon_cmd, args.extra, socket_dir)
    start_checks.check_daemon_loads_verified(args.extra)
    start_checks.probe_vllm(args.daemon_cmd, socket_dir)
    config = Config(
        model_dir=os.path.abspath(args.model_dir) if args.model_dir else None,
        follow=os.path.abspath(args.follow) if args.follow else None,
        verified_only=args.verified_only,
        daemon_cmd=args.daemon_cmd,
        extra=args.extra,
        state_dir=args.state_dir or st.default_state_dir(),
        interval=args.interval,
        one_at_a_time=args.one_at_a_time,
        socket_dir=socket_dir,
        ready_timeout=args.ready_timeout,
        stop_timeout=args.stop_timeout,
        retry_delay=args.retry_delay,
        ready_pattern=args.ready_pattern,
        quiet=args.quiet,
    )
    try:
        return Supervisor(config).run()
    except ValueError as error:  # a --daemon-cmd shlex cannot split
        raise CkptpubError(str(error)) from error


def _history(args: PreloadArguments) -> int:
    state_dir = args.state_dir or st.default_state_dir()
    st.check_readable(state_dir)
    if not os.path.lexists(os.path.join(state_dir, st.DECISIONS)):
        raise CkptpubError(f"{state_dir}: no decision log (has a supervisor run with this --state-dir?)")
    for entry in st.read_decisions(state_dir, _skipped):
        print(json.dumps(entry, sort_keys=True) if args.json else st.format_entry(entry))
    return ExitCode.OK


def _skipped(number: int, why: str) -> None:
    """A decision-log line that is not an entry, in one line on stderr (as the run index's are)."""
    print(one_line(f"ckptpub preload: {st.DECISIONS} line {number} skipped: {why}"), file=sys.stderr)


def _status(args: PreloadArguments) -> int:
    state_dir = args.state_dir or st.default_state_dir()
    st.check_readable(state_dir)
    data = st.read_status(state_dir)
    data["supervisor_alive"] = st.SupervisorLock(state_dir).held()
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
    return ExitCode.OK if good else ExitCode.MISMATCH
