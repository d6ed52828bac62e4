"""The ``ckptpub`` command: one argparse parser, a function from arguments to an exit code.

Exit codes (``ExitCode``, shared by every command, ``ckptpub preload`` too): 0 all
good; 1 a mismatch or difference was found; 2 unusable input, a usage error, or
anything else that prevented a verdict. Every failure is one line on stderr, never a
traceback (``CKPTPUB_DEBUG=1``, a flag: ``on``/``true``/``yes`` too, shows the traceback instead). Results
go to stdout in lines that people and scripts can both read (``path: OK`` /
``path: FAILED (...)``), or as JSON.

Other distributions add commands through the ``ckptpub.commands`` entry-point group
(``ckptpub preload`` comes from ckptpub-vllm): each entry point is a ``Command``, and
its sub-parser joins this same parser, so every command has one help layout, one
error format and one exit-code table.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import functools
import gc
import io
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, NoReturn, TypeVar

from .._filesystem.hub_cache import locate
from .._filesystem.read import read_manifest
from .._filesystem.safe_open import read_bounded
from .._filesystem.scan import absolute_location
from .._format.manifest import MAX_MANIFEST_BYTES
from .._format.names import MANIFEST_NAME, SIGNATURE_NAME
from .._hashing.distributed import DEFAULT_TIMEOUT_S, DistributedHasher, env_world, init_from_env
from .._hashing.engine import FILE_HASHES
from .._operations.diff import diff_manifests
from .._operations.explain import base_hub_of, base_of, hub_name, is_adapter, storage_name
from .._operations.publishing import publish, publish_on_ranks
from .._operations.verify import verify
from .._runs.runview import RunEntry, lineage, list_run
from .._settings import DEBUG_ENV, env_flag, seconds
from .._version import __version__
from ..errors import CkptpubError, one_line
from .printing import (
    diff_json,
    gb,
    manifest_summary,
    note,
    plural,
    print_config_lines,
    print_diff_lines,
    print_json,
    print_run_table,
    print_tree,
    print_verify_lines,
    to_stderr,
    value_text,
    verify_json,
)
from .progress import ProgressBar

#: Entry-point group through which other distributions add commands; each entry point is a ``Command``.
COMMANDS_GROUP = "ckptpub.commands"


class ExitCode(enum.IntEnum):
    """What the exit status of every ``ckptpub`` command means."""

    OK = 0
    MISMATCH = 1  # a difference was found (verify, diff; ``preload --status``: the target is not held)
    UNUSABLE = 2  # unusable input, a usage error, or anything else that prevented a verdict
    INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT
    # the reader of stdout went away (``ckptpub verify | head``), as a shell reports SIGPIPE
    BROKEN_PIPE = 141


class UsageError(Exception):
    """A command line that cannot be run: exit 2, one line that points at the command's ``--help``.

    argparse raises it through ``_Parser.error``; a command's ``run`` raises it for
    combinations argparse cannot express (``program`` is then filled in by ``main``).
    """

    def __init__(self, message: str, program: str | None = None) -> None:
        super().__init__(message)
        self.program = program


Arguments = TypeVar("Arguments")


@dataclass(frozen=True)
class Command(Generic[Arguments]):
    """One ``ckptpub NAME`` command.

    ``add_arguments`` adds its arguments to its sub-parser (and may set the parser's
    ``description`` and ``epilog``); the parsed values, one per ``dest``, build an
    ``arguments`` instance (a dataclass) that ``run`` gets and turns into an exit code.
    With ``passthrough``, whatever follows the first ``--`` is not parsed but handed to
    ``run`` as the ``extra`` field. ``program`` starts the command's error lines.

    ``one_shot`` commands do one job over a checkpoint and end; the cycle collector
    is off while they run. They build a record per tensor (hundreds of thousands for
    a mixture of experts), none in a cycle, and the collector would walk them again
    and again (0.4 s of a 1.2 s ``verify`` of 98,304 tensors); reference counting
    frees them as before. A long-running command (``preload``) keeps it.
    """

    name: str
    help: str
    arguments: type[Arguments]
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Arguments], int]
    program: str = "ckptpub"
    passthrough: bool = False
    one_shot: bool = False


@contextlib.contextmanager
def _without_cycle_collector() -> Iterator[None]:
    """The cycle collector off for the block (see ``Command.one_shot``), back as it was after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _StderrLines(logging.Handler):
    """Each record as one line on stderr, as every note of the CLI is (its text starts ``ckptpub: ``)."""

    def emit(self, record: logging.LogRecord) -> None:
        to_stderr(one_line(record.getMessage()))


@contextlib.contextmanager
def _library_warnings_on_stderr() -> Iterator[None]:
    """Warnings the library logs while a command runs (``ckptpub`` logger), each a line on stderr.

    Such a warning does not change the outcome (a published manifest whose folder's
    modification time could not be put back); it is shown once, not also by a handler
    of the root logger.
    """
    library = logging.getLogger("ckptpub")
    handler = _StderrLines(logging.WARNING)
    library.addHandler(handler)
    propagate, library.propagate = library.propagate, False
    try:
        yield
    finally:
        library.removeHandler(handler)
        library.propagate = propagate


class _Parser(argparse.ArgumentParser):
    """argparse with exact option names, and a usage error raised as one ``UsageError`` line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # a new option must never change what a script meant
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.prog)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``) and return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _occupy_closed_standard_fds()
    _escape_unencodable_output()
    program = "ckptpub"  # what the error line starts with: the command's own program, once known
    tracebacks = False
    try:
        tracebacks = debugging()  # a CKPTPUB_DEBUG that is neither on nor off is refused in one line
        commands = _commands(argv)
        named = commands.get(argv[0]) if argv else None
        if named is not None:  # a usage error in its arguments is said in its name
            program = named.program
        command, arguments = _parse(commands, argv)
        try:
            with (
                _library_warnings_on_stderr(),
                _without_cycle_collector() if command.one_shot else contextlib.nullcontext(),
            ):
                code = command.run(arguments)
        except UsageError as error:
            error.program = error.program or f"ckptpub {command.name}"
            raise
        _flush_stdout()
        return code
    except SystemExit as done:  # --help or --version (argparse printed it), or a command's sys.exit
        _flush_stdout()
        if done.code is None or isinstance(done.code, int):
            return done.code or ExitCode.OK
        fail(str(done.code), program=program)  # sys.exit("message"), as Python itself would print it
        return ExitCode.UNUSABLE
    except BrokenPipeError:  # the reader of stdout went away: nothing to say, nobody to say it to
        _discard_stdout()
        return ExitCode.BROKEN_PIPE
    except (Exception, KeyboardInterrupt) as error:
        if tracebacks:
            raise
        message, code = _explain(error)
        fail(message, program=program)
        return code


def run() -> NoReturn:
    """Console entry point (through ``console.main``): ``main()``, then exit with exactly its code.

    Output is flushed here, so a full or closed stdout still ends with the exit code
    ``main`` chose (interpreter shutdown would flush it again, print a warning and
    exit 120); ``os._exit`` then skips that second flush. A manifest is already
    fsynced by then. Under ``CKPTPUB_DEBUG`` the traceback ``main`` let through is
    printed, and the exit code still says "no verdict" (2), never Python's 1. A
    Ctrl-C at any moment here ends the run with exit 130 and one line.
    """
    try:
        try:
            code = main()
        except KeyboardInterrupt as error:  # Ctrl-C while main was already handling another outcome
            if _tracebacks_wanted():
                traceback.print_exception(error)
            else:
                fail("interrupted")
            code = ExitCode.INTERRUPTED
        except Exception as error:  # only under CKPTPUB_DEBUG: main re-raised it
            traceback.print_exception(error)
            code = ExitCode.UNUSABLE
        code = _flush_streams(code)
        for hasher in _JOINED:  # torchrun stops every rank once one exits non-zero: let rank 0 say why first
            hasher.meet()
    except KeyboardInterrupt:  # another Ctrl-C while the first one, or the output, was handled
        with contextlib.suppress(KeyboardInterrupt):  # and one more while this line is written
            fail("interrupted")
        code = ExitCode.INTERRUPTED
    os._exit(code)


def _flush_streams(code: int) -> int:
    """Flush stdout and stderr; the exit code, or 141/2 for output lost when there was nothing else to say."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except BrokenPipeError:
            code = code or ExitCode.BROKEN_PIPE
        except (OSError, ValueError):  # full, closed: main already reported what it could
            code = code or ExitCode.UNUSABLE
    return code


def debugging() -> bool:
    """Whether the flag ``CKPTPUB_DEBUG`` asks for tracebacks instead of one-line errors."""
    return env_flag(DEBUG_ENV)


def _tracebacks_wanted() -> bool:
    """``debugging()``, and off for a ``CKPTPUB_DEBUG`` that is neither on nor off (``main`` said so)."""
    try:
        return debugging()
    except CkptpubError:
        return False


def fail(message: str, *, program: str = "ckptpub") -> None:
    """The one line a failed command leaves on stderr: ``PROGRAM: error: MESSAGE``."""
    to_stderr(f"{program}: error: {one_line(message)}")


def build_parser(commands: Iterable[Command[Any]]) -> argparse.ArgumentParser:
    """The parser of ``ckptpub``: one sub-parser per command, built-in or installed."""
    parser = _Parser(
        prog="ckptpub",
        description="BLAKE3 manifests for model checkpoints.",
        epilog="'ckptpub COMMAND --help' shows a command's arguments and options.",
    )
    parser.add_argument("--version", action="version", version=f"ckptpub {__version__}")
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND", required=True)
    for command in commands:
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(sub)
    return parser


def _commands(argv: Sequence[str]) -> dict[str, Command[Any]]:
    """The built-in commands, and those of installed distributions unless ``argv`` names a built-in one.

    Importing ``importlib.metadata`` and scanning every installed distribution's
    entry points is a large share of a small command's start-up, so a built-in
    command such as ``ckptpub verify`` skips both.
    """
    commands = {command.name: command for command in BUILT_IN}
    if argv and argv[0] in commands:
        return commands
    from importlib.metadata import entry_points  # imports email, zipfile, csv...: only when needed

    for entry in entry_points(group=COMMANDS_GROUP):
        if entry.name in commands:  # a built-in name cannot be taken over
            continue
        try:
            command = entry.load()
        except Exception as error:
            why = f"{type(error).__name__}: {error}"
            raise CkptpubError(
                f"the command {entry.name!r} ({entry.value}) cannot be loaded: {why}"
            ) from error
        if not isinstance(command, Command) or command.name != entry.name:
            raise CkptpubError(f"the entry point {entry.name!r} ({entry.value}) is not a ckptpub Command")
        commands[entry.name] = command
    return commands


def _parse(commands: dict[str, Command[Any]], argv: list[str]) -> tuple[Command[Any], Any]:
    """The command ``argv`` names and its parsed, typed arguments; raises ``UsageError``."""
    named = commands.get(argv[0]) if argv else None
    extra: list[str] = []
    if named is not None and named.passthrough and "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    namespace, unknown = build_parser(commands.values()).parse_known_args(argv)
    values = vars(namespace)
    command = commands[values.pop("command")]
    if unknown:  # said here, where the hint can name the command's own --help
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)}", f"ckptpub {command.name}")
    if command.passthrough:
        values["extra"] = extra
    return command, command.arguments(**values)


def _explain(error: BaseException) -> tuple[str, ExitCode]:
    """The one-line message and exit code for an exception that ended a command."""
    if isinstance(error, UsageError):
        return f"{error} (see '{error.program or 'ckptpub'} --help')", ExitCode.UNUSABLE
    if isinstance(error, KeyboardInterrupt):
        return "interrupted", ExitCode.INTERRUPTED
    if isinstance(error, CkptpubError):
        return str(error), ExitCode.UNUSABLE
    if isinstance(error, OSError):
        return f"{error.filename or ''}: {error.strerror or error}".lstrip(": "), ExitCode.UNUSABLE
    if isinstance(error, RecursionError):  # a document nested just under the parser's limit, printed
        return "a JSON document is nested too deeply to handle", ExitCode.UNUSABLE
    return f"internal error: {type(error).__name__}: {error}", ExitCode.UNUSABLE  # a bug: still no verdict


def _occupy_closed_standard_fds() -> None:
    """Point a closed stdin/stdout/stderr descriptor at /dev/null.

    Otherwise the next file opened (a checkpoint file, the manifest's temporary
    file) would get descriptor 1 or 2, and output meant for the terminal could
    land in it. Python already shows such a stream as ``None``; output to it is dropped.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one


def _escape_unencodable_output() -> None:
    """Names that the output encoding cannot show (PYTHONIOENCODING=ascii, a Latin-1 terminal) are escaped."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):  # not None (closed at start-up) nor a test's StringIO
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors="backslashreplace")


def _discard_stdout() -> None:
    """Point stdout at /dev/null: output it could not take is dropped, not retried (and failed) at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _flush_stdout() -> None:
    """Flush results inside ``main`` so a full or closed stdout is reported as one line, exit 2."""
    if sys.stdout is not None:
        sys.stdout.flush()


# -- the built-in commands: each one's typed arguments, its parser, what it runs --------------------


@dataclass(frozen=True)
class PublishArguments:
    folder: str
    revision: str | None
    threads: int | None
    no_mmap: bool
    allow_no_weights: bool
    allow_nested: bool
    base: str | None
    adapter: str | None
    sign: str | None
    sign_hash: str | None
    signing_certificate: str | None
    certificate_chain: list[str] | None
    json: bool
    rank_timeout: float


@dataclass(frozen=True)
class VerifyArguments:
    folder: str
    revision: str | None
    quiet: bool
    expect_identity: str | None
    public_key: str | None
    certificate_chain: list[str] | None
    threads: int | None
    no_mmap: bool
    json: bool
    rank_timeout: float


@dataclass(frozen=True)
class ShowArguments:
    folder: str
    revision: str | None
    json: bool


@dataclass(frozen=True)
class DiffArguments:
    a: str
    b: str
    json: bool


@dataclass(frozen=True)
class RunArguments:
    """``ls`` and ``log``: a run's output folder (``tree``: ``ls --tree``; ``log`` always prints the tree)."""

    run_dir: str
    json: bool
    tree: bool = False


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def seconds_argument(text: str) -> float:
    """An argparse ``type`` for a duration: ``_settings.seconds`` (NaN, infinities, 0 and less refused)."""
    try:
        return seconds(text)
    except CkptpubError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


#: The torchrun job a command joined (``_join_ranks``): its ranks meet once more before they exit.
_JOINED: list[DistributedHasher] = []


def _join_ranks(timeout_s: float) -> DistributedHasher | None:
    """Under ``torchrun`` with several processes: join its group; ranks other than 0 then print nothing."""
    if env_world() is None:
        return None
    hasher = init_from_env(timeout_s)
    _JOINED.append(hasher)
    if hasher.rank != 0:  # rank 0 reports for all of them, including every rank's failure
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
    return hasher


def _add_folder(parser: argparse.ArgumentParser, help: str = "the checkpoint folder") -> None:
    """The checkpoint argument: a folder, or a model in the Hugging Face cache by its hub id."""
    parser.add_argument("folder", metavar="FOLDER", help=f"{help}, or {_HUB_ID_HELP}")
    parser.add_argument(
        "--revision", metavar="REV", help="with a hub id: the branch, tag or commit (default: main)"
    )


#: What an argument that names a checkpoint may be besides a folder (``hub_cache.locate``).
_HUB_ID_HELP = (
    "a model's hub id in the Hugging Face cache (org/name or org/name@REVISION; a folder that exists wins)"
)


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of lines")


def _add_hashing(parser: argparse.ArgumentParser) -> None:
    """The options of the two commands that hash: the knobs of ``_hashing.options.HashOptions``."""
    parser.add_argument(
        "--threads", type=_positive, metavar="N", help="hashing threads (default: one per CPU)"
    )
    parser.add_argument(
        "--no-mmap",
        action="store_true",
        help="read with pread instead of mmap (spinning disks, some network file systems)",
    )
    parser.add_argument(
        "--rank-timeout",
        type=seconds_argument,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="under torchrun (the work is spread over its ranks, rank 0 writes and prints): fail when a "
        f"rank has not answered within SECONDS (default {DEFAULT_TIMEOUT_S:.0f}; it must cover one rank's "
        "hashing)",
    )


def _add_publish(parser: argparse.ArgumentParser) -> None:
    _add_folder(parser)
    _add_hashing(parser)
    parser.add_argument(
        "--allow-no-weights",
        action="store_true",
        help="publish a folder without *.safetensors weights (FSDP, DeepSpeed, .bin)",
    )
    parser.add_argument(
        "--allow-nested",
        action="store_true",
        help="publish a folder that holds other checkpoints (checkpoint-N, manifests)",
    )
    parser.add_argument(
        "--base",
        metavar="DIR|ID",
        help="record the model this one was made from (a published folder or an identity)",
    )
    parser.add_argument(
        "--adapter",
        metavar="DIR|ID",
        help="record the adapter merged into this model (a published folder or an identity)",
    )
    parser.add_argument(
        "--sign", metavar="KEY", help="also write model.sig, signed with this ECDSA private key (PEM)"
    )
    parser.add_argument(
        "--sign-hash",
        choices=FILE_HASHES,
        help="with --sign: the file digest model.sig lists (default sha256, which `model_signing verify` "
        "checks; blake3 costs a fraction of it and verifies with model_signing's Python API and "
        "`ckptpub verify --public-key`)",
    )
    parser.add_argument(
        "--signing-certificate", metavar="CERT", help="with --sign: sign as this certificate's holder (PEM)"
    )
    _add_certificate_chain(parser, "with --signing-certificate: the certificates up to the trusted root")
    _add_json(parser)


def _add_certificate_chain(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--certificate-chain", metavar="PEM", action="append", help=f"{help} (repeatable)")


def _add_verify(parser: argparse.ArgumentParser) -> None:
    _add_folder(parser)
    parser.add_argument("--quiet", action="store_true", help="print only failures")
    parser.add_argument(
        "--expect-identity", metavar="ID", help="also fail unless the manifest's identity is ID"
    )
    parser.add_argument(
        "--public-key", metavar="PUB", help="first check that model.sig signs exactly this manifest with PUB"
    )
    _add_certificate_chain(parser, "as --public-key, trusting certificates this chain vouches for")
    _add_hashing(parser)
    _add_json(parser)


def _add_show(parser: argparse.ArgumentParser) -> None:
    _add_folder(parser, "the checkpoint folder or its manifest file")
    _add_json(parser)


def _add_diff(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", help=f"checkpoint folder or manifest file, or {_HUB_ID_HELP}")
    parser.add_argument("b", metavar="B", help="the same for the other side")
    _add_json(parser)


def _add_run_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's output folder")
    _add_json(parser)


def _add_ls(parser: argparse.ArgumentParser) -> None:
    _add_run_dir(parser)
    parser.add_argument("--tree", action="store_true", help="show the run's lineage, as 'ckptpub log' does")


def _cmd_publish(args: PublishArguments) -> int:
    args = replace(args, folder=locate(args.folder, args.revision))
    sign = _signing_key(args)
    # Publishing a signed folder again without a key leaves a signature of the old manifest behind.
    unsigned_over_signed = sign is None and os.path.lexists(os.path.join(args.folder, SIGNATURE_NAME))
    signed_before = _manifest_bytes(args.folder) if unsigned_over_signed else None
    hasher = _join_ranks(args.rank_timeout)
    bar = ProgressBar("hashing")
    try:
        manifest = (publish if hasher is None else functools.partial(publish_on_ranks, hasher=hasher))(
            args.folder,
            threads=args.threads,
            use_mmap=not args.no_mmap,
            on_progress=bar,
            allow_no_weights=args.allow_no_weights,
            allow_nested=args.allow_nested,
            base=args.base,
            adapter=args.adapter,
            sign=sign,
            sign_hash=args.sign_hash or "sha256",
        )
    finally:
        bar.close()
    try:
        if args.json:
            print_json(manifest_summary(manifest, args.folder))
        else:
            print(manifest.identity)
        _flush_stdout()
    except (OSError, ValueError) as error:  # the manifest is published: say so, and that its identity is here
        if isinstance(error, BrokenPipeError):
            raise
        _discard_stdout()
        note(
            f"warning: published {os.path.join(args.folder, MANIFEST_NAME)} (identity {manifest.identity}), "
            f"but could not write to stdout: {getattr(error, 'strerror', None) or error}"
        )
    note(
        f"published {os.path.join(args.folder, MANIFEST_NAME)}: {manifest.tensor_count} tensors, "
        f"{len(manifest.files)} files, {gb(sum(f.size for f in manifest.files))}"
    )
    if signed_before is not None and signed_before != manifest.to_json():  # the bytes publish wrote
        note(
            f"warning: {os.path.join(args.folder, SIGNATURE_NAME)} signs the manifest this publish replaced, "
            f"so it no longer verifies; sign again: ckptpub publish --sign KEY {args.folder}"
        )
    return ExitCode.OK


def _manifest_bytes(folder: str) -> bytes | None:
    """The folder's manifest as it is on disk; None when it cannot be read."""
    try:
        return read_bounded(os.path.join(folder, MANIFEST_NAME), MAX_MANIFEST_BYTES, MANIFEST_NAME)
    except CkptpubError:
        return None


def _cmd_verify(args: VerifyArguments) -> int:
    args = replace(args, folder=locate(args.folder, args.revision))
    trusted = _trusted_key(args)
    hasher = _join_ranks(args.rank_timeout)
    bar = ProgressBar("verifying")
    options: dict[str, Any] = {
        "expect_identity": args.expect_identity,
        "threads": args.threads,
        "use_mmap": not args.no_mmap,
        "on_progress": bar,
    }
    try:
        with contextlib.nullcontext() if hasher is None else hasher.taking_part():
            if trusted is None:
                report = verify(args.folder, hasher=hasher, **options)
            else:  # the signature first: it must cover exactly the manifest verified
                from .._operations.signing import verify_signed

                report = verify_signed(args.folder, trusted, hasher=hasher, **options)
    finally:
        bar.close()
    if args.json:
        print_json(verify_json(report, args.folder))
    else:
        print_verify_lines(report, quiet=args.quiet)
    tensors = report.manifest.tensor_count
    if report.ok:
        note(
            f"{args.folder}: OK, {len(report.checked)} files, {tensors} tensors, "
            f"identity {report.manifest.identity}"
        )
        return ExitCode.OK
    changed = sum(p.kind == "tensor" for p in report.problems)
    note(
        f"{args.folder}: FAILED, {plural(len(report.problems), 'problem')} "
        f"({plural(changed, 'tensor')} changed) in {plural(len(report.checked), 'file')}"
    )
    return ExitCode.MISMATCH


def _signing_key(args: PublishArguments) -> Any:
    """``--sign KEY`` (with ``--signing-certificate``/``--certificate-chain``) as ``publish(sign=...)``."""
    if args.sign is None:
        if args.signing_certificate is not None or args.certificate_chain or args.sign_hash is not None:
            raise UsageError(
                "--sign-hash, --signing-certificate and --certificate-chain need --sign KEY",
                "ckptpub publish",
            )
        return None
    from .._operations.signing import SigningKey  # only a signing run imports it

    return SigningKey(args.sign, args.signing_certificate, tuple(args.certificate_chain or ()))


def _trusted_key(args: VerifyArguments) -> Any:
    """``--public-key PUB`` or ``--certificate-chain PEM`` as a ``TrustedKey``; None for neither."""
    if args.public_key is not None and args.certificate_chain:
        raise UsageError("give --public-key or --certificate-chain, not both", "ckptpub verify")
    if args.public_key is None and not args.certificate_chain:
        return None  # what TrustedKey.of says too, without importing signing (and hashlib) on every verify
    from .._operations.signing import TrustedKey

    return TrustedKey.of(args.public_key, args.certificate_chain or ())


def _cmd_show(args: ShowArguments) -> int:
    args = replace(args, folder=locate(args.folder, args.revision))
    manifest = read_manifest(args.folder)
    summary = manifest_summary(manifest, args.folder)
    if args.json:
        print_json(summary)
        return ExitCode.OK
    base = base_of(manifest)
    base_hub = base_hub_of(manifest)
    kind = "adapter" if is_adapter(manifest) else "model"
    on_base = f"{kind} on base {base}" + (f" ({base_hub})" if base_hub else "")
    rows = [
        ("identity", manifest.identity),
        ("kind", on_base if base else f"{kind} (no base recorded)"),
        ("folder", absolute_location(args.folder)),
        ("weights", ", ".join(manifest.weights) or "(none: identity covers every file)"),
        ("tensors", f"{summary['tensors']} ({gb(summary['tensor_bytes'])})"),
        ("files", f"{summary['files']} ({gb(summary['bytes'])})"),
        *(("config", f"{name} {digest}") for name, digest in sorted(manifest.config.items())),
        *(
            (key, hub_name(value) or storage_name(value) or value_text(value))
            for key, value in sorted(manifest.provenance.items())
        ),
    ]
    width = max(len(key) for key, _ in rows) + 2
    for key, value in rows:
        print(f"{key + ':':<{width}}{one_line(value)}")
    return ExitCode.OK


def _cmd_diff(args: DiffArguments) -> int:
    args = replace(args, a=locate(args.a), b=locate(args.b))
    a, b = read_manifest(args.a), read_manifest(args.b)
    folders = [path if os.path.isdir(path) else None for path in (args.a, args.b)]
    difference = diff_manifests(a, b, folder_a=folders[0], folder_b=folders[1])
    if args.json:
        print_json(diff_json(difference, a, b))
    elif difference.same:
        print(f"same identity {difference.identity_a}")
        print_config_lines(difference)  # keys that changed without changing the model (use_cache, ...)
    else:
        print_diff_lines(difference, a, b)
    if difference.same:
        return ExitCode.OK
    note(
        f"different identities: {len(difference.changed)} tensors changed, {len(difference.added)} added, "
        f"{len(difference.removed)} removed, {plural(len(difference.config_changed), 'config')} changed"
    )
    return ExitCode.MISMATCH


def _cmd_ls(args: RunArguments) -> int:
    entries = list_run(args.run_dir)
    if args.tree:
        print_tree(lineage(entries), args.json)
    elif args.json:
        print_json([e.as_dict() for e in entries])
    else:
        print_run_table(entries)
    return _run_outcome(args.run_dir, entries)


def _cmd_log(args: RunArguments) -> int:
    entries = list_run(args.run_dir)
    print_tree(lineage(entries), args.json)
    return _run_outcome(args.run_dir, entries)


def _run_outcome(run_dir: str, entries: list[RunEntry]) -> int:
    """What every view of a run ends with: the summary line (unusable ones counted), and exit 2 if any."""
    unusable = sum(e.status == "unusable" for e in entries)
    published = sum(e.status == "ok" for e in entries)
    gone = sum(e.status == "gone" for e in entries)
    note(
        f"{plural(published, 'published checkpoint')} under {run_dir}"
        + (f", {gone} rotated away" if gone else "")
        + (f", {unusable} unusable" if unusable else "")
    )
    return ExitCode.UNUSABLE if unusable else ExitCode.OK


BUILT_IN: tuple[Command[Any], ...] = (
    Command(
        "publish",
        "hash a checkpoint folder and write its ckptpub.json",
        PublishArguments,
        _add_publish,
        _cmd_publish,
        one_shot=True,
    ),
    Command(
        "verify",
        "re-hash a folder and report every difference from its manifest",
        VerifyArguments,
        _add_verify,
        _cmd_verify,
        one_shot=True,
    ),
    Command(
        "show",
        "print a checkpoint's identity and summary from its manifest",
        ShowArguments,
        _add_show,
        _cmd_show,
        one_shot=True,
    ),
    Command(
        "diff",
        "compare the model tensors of two manifests (no data is read)",
        DiffArguments,
        _add_diff,
        _cmd_diff,
        one_shot=True,
    ),
    Command(
        "ls",
        "list the published checkpoints of a training run (its run index, then a folder scan)",
        RunArguments,
        _add_ls,
        _cmd_ls,
        one_shot=True,
    ),
    Command(
        "log",
        "show a training run's lineage: each recorded base, then the steps trained from it",
        RunArguments,
        _add_run_dir,
        _cmd_log,
        one_shot=True,
    ),
)
