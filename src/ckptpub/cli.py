"""The ``ckptpub`` command: a function from arguments to an exit code.

Exit codes: 0 all good; 1 a mismatch or difference was found; 2 unusable input,
a usage error, or anything else that prevented a verdict. Every failure is one
line on stderr, never a traceback. Results go to stdout in lines that people and
scripts can both read (``path: OK`` / ``path: FAILED (...)``), or as JSON.
"""

from __future__ import annotations

import os
import sys

from . import __version__
from .arguments import Arguments, Command, HelpRequested, Option, UsageError, parse
from .errors import CkptpubError
from .manifest import MANIFEST_NAME
from .progress import ProgressBar
from .read import read_manifest

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see records.py)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from .compare import ManifestDiff, VerifyReport
    from .manifest import Manifest

EXIT_OK, EXIT_MISMATCH, EXIT_UNUSABLE = 0, 1, 2
_LS_DEPTH = 3


#: Entry-point group through which other distributions add commands (``ckptpub preload``
#: comes from ckptpub-vllm). Each entry point is a ``main(argv: list[str]) -> int``.
COMMANDS_GROUP = "ckptpub.commands"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``) and return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _occupy_closed_standard_fds()
    _escape_unencodable_output()
    try:
        if argv and not argv[0].startswith("-") and all(argv[0] != c.name for c in COMMANDS):
            extension = _extension_command(argv[0])
            if extension is not None:
                return extension(argv[1:])
        command, args = parse("ckptpub", DESCRIPTION, __version__, COMMANDS, argv)
        code = command.run(args)
        _flush_stdout()
        return code
    except HelpRequested as text:
        print(text)
        if argv[0] in ("-h", "--help"):
            _print_extension_commands()
        return EXIT_OK
    except UsageError as error:
        _fail(f"{error} (see 'ckptpub {error.command + ' ' if error.command else ''}--help')")
        return EXIT_UNUSABLE
    except CkptpubError as error:
        _fail(str(error))
        return EXIT_UNUSABLE
    except BrokenPipeError:  # the reader of stdout went away (``ckptpub verify | head``)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # what a shell reports for SIGPIPE
    except OSError as error:
        _fail(f"{error.filename or ''}: {error.strerror or error}".lstrip(": "))
        return EXIT_UNUSABLE
    except KeyboardInterrupt:
        _fail("interrupted")
        return 130
    except RecursionError:  # a document nested just under the parser's limit, printed or encoded
        _fail("a JSON document is nested too deeply to handle")
        return EXIT_UNUSABLE
    except Exception as error:  # a bug: still one line, still no verdict
        _fail(f"internal error: {type(error).__name__}: {error}")
        return EXIT_UNUSABLE


# Each command imports what it alone needs: start-up time is part of every run.


def run() -> None:
    """Console entry point: ``main()``, then exit without tearing the interpreter down.

    Everything the command wrote is flushed (and a manifest is fsynced) before this
    point, so skipping module teardown loses nothing and saves a few milliseconds of
    every run, which matter when the whole run is a fraction of a second.
    """
    try:
        code = main()
    except KeyboardInterrupt:  # Ctrl-C while main was already handling another outcome
        code = 130
        _fail("interrupted")
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except BrokenPipeError:
            code = code or 128 + 13
        except (OSError, ValueError):  # full, closed: main already reported what it could
            code = code or EXIT_UNUSABLE
    os._exit(code)


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
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):  # None (closed at start-up) or not a text stream
            pass


def _flush_stdout() -> None:
    """Flush results inside ``main`` so a full or closed stdout is reported as one line, exit 2."""
    if sys.stdout is not None:
        sys.stdout.flush()


def _cmd_publish(args: Arguments) -> int:
    from .publishing import publish

    bar = ProgressBar("hashing")
    try:
        manifest = publish(args.folder, threads=args.threads, use_mmap=not args.no_mmap, on_progress=bar,
                           allow_no_weights=args.allow_no_weights, allow_nested=args.allow_nested)
    finally:
        bar.close()
    try:
        if args.json:
            _print_json(_summary(manifest, args.folder))
        else:
            print(manifest.identity)
        _flush_stdout()
    except (OSError, ValueError) as error:
        if isinstance(error, BrokenPipeError):
            raise
        raise CkptpubError(f"published {os.path.join(args.folder, MANIFEST_NAME)} (identity {manifest.identity}), "
                           f"but could not write to stdout: {getattr(error, 'strerror', None) or error}") from None
    _note(
        f"published {os.path.join(args.folder, MANIFEST_NAME)}: {len(manifest.tensors)} tensors, "
        f"{len(manifest.files)} files, {_gb(sum(f.size for f in manifest.files))}"
    )
    return EXIT_OK


def _cmd_verify(args: Arguments) -> int:
    from .compare import verify

    bar = ProgressBar("verifying")
    try:
        report = verify(args.folder, expect_identity=args.expect_identity, threads=args.threads,
                        use_mmap=not args.no_mmap, on_progress=bar)
    finally:
        bar.close()
    if args.json:
        _print_json(_verify_json(report, args.folder))
    else:
        _print_verify_lines(report, quiet=args.quiet)
    tensors = len(report.manifest.tensors)
    if report.ok:
        _note(f"{args.folder}: OK, {len(report.checked)} files, {tensors} tensors, identity {report.manifest.identity}")
        return EXIT_OK
    changed = sum(p.kind == "tensor" for p in report.problems)
    _note(f"{args.folder}: FAILED, {len(report.problems)} problems ({changed} tensors changed) in {len(report.checked)} files")
    return EXIT_MISMATCH


def _cmd_show(args: Arguments) -> int:
    import json  # for nested provenance values; not imported above (see strict_json)

    manifest = read_manifest(args.folder)
    summary = _summary(manifest, args.folder)
    if args.json:
        _print_json(summary)
        return EXIT_OK
    print(f"identity:   {manifest.identity}")
    print(f"folder:     {_safe(os.path.abspath(args.folder))}")
    print(f"weights:    {', '.join(map(_safe, manifest.weights)) or '(none: identity covers every file)'}")
    print(f"tensors:    {summary['tensors']} ({_gb(summary['tensor_bytes'])})")
    print(f"files:      {summary['files']} ({_gb(summary['bytes'])})")
    for name, digest in sorted(manifest.config.items()):
        print(f"config:     {name} {digest}")
    for key, value in sorted(manifest.provenance.items()):
        print(f"{key + ':':<11} {_safe(json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value))}")
    return EXIT_OK


def _cmd_diff(args: Arguments) -> int:
    from .compare import diff_manifests

    difference = diff_manifests(read_manifest(args.a), read_manifest(args.b))
    if args.json:
        _print_json(_diff_json(difference))
    else:
        for kind in ("changed", "added", "removed"):
            for name in getattr(difference, kind):
                print(f"{kind:<8} {_safe(name)}")
        for name in difference.config_changed:
            print(f"config   {name}")
    _note(
        ("same identity" if difference.same else "different identities")
        + f": {len(difference.changed)} tensors changed, {len(difference.added)} added, "
        f"{len(difference.removed)} removed, {len(difference.config_changed)} configs changed"
    )
    return EXIT_OK if difference.same else EXIT_MISMATCH


def _cmd_ls(args: Arguments) -> int:
    if not os.path.isdir(args.run_dir):
        raise CkptpubError(f"{args.run_dir}: not a folder")
    rows, unusable = [], 0
    unlisted: list[OSError] = []
    for folder in _published_folders(args.run_dir, unlisted.append):
        relative = os.path.relpath(folder, args.run_dir)
        try:
            manifest = read_manifest(folder)
        except CkptpubError as error:
            unusable += 1
            rows.append({"path": relative, "step": _step(None, folder), "identity": None, "error": str(error)})
            continue
        rows.append({"path": relative, "step": _step(manifest, folder), "identity": manifest.identity})
    for error in unlisted:
        unusable += 1
        relative = os.path.relpath(error.filename or args.run_dir, args.run_dir)
        message = f"{relative}: cannot list folder: {error.strerror or error}"
        rows.append({"path": relative, "step": _step(None, relative), "identity": None, "error": message})
    rows.sort(key=lambda r: (r["step"] is None, r["step"] or 0, r["path"]))
    if args.json:
        _print_json(rows)
    else:
        for row in rows:
            step = "-" if row["step"] is None else str(row["step"])
            print(f"{step:>8}  {row['identity'] or 'UNUSABLE':<71}  {_safe(row['path'])}")
    _note(f"{len(rows)} published checkpoints under {args.run_dir}" + (f", {unusable} unusable" if unusable else ""))
    return EXIT_UNUSABLE if unusable else EXIT_OK


def _extension_command(name: str):
    """The ``main`` registered for ``name`` by an installed distribution, if any.

    Looked up only for names that are not built in, so built-in commands never pay
    for scanning installed distributions.
    """
    from importlib.metadata import entry_points

    for entry in entry_points(group=COMMANDS_GROUP):
        if entry.name == name:
            return entry.load()
    return None


def _print_extension_commands() -> None:
    from importlib.metadata import entry_points

    names = sorted({entry.name for entry in entry_points(group=COMMANDS_GROUP)})
    if names:
        print(f"\nadded by installed distributions: {', '.join(names)} ('ckptpub NAME --help' for each)")


def _published_folders(run_dir: str, on_error):
    """Folders holding a manifest, at most ``_LS_DEPTH`` levels down, not inside another checkpoint.

    The run folder itself is looked into even when it holds a manifest (a stray
    ``ckptpub publish RUN_DIR`` must not hide the run's checkpoints). Folders that
    cannot be listed go to ``on_error``: a checkpoint is never left out silently.
    """
    for current, dirs, files in os.walk(run_dir, onerror=on_error):
        if MANIFEST_NAME in files or MANIFEST_NAME in dirs:
            yield current
            if current != run_dir:
                dirs.clear()
        if os.path.relpath(current, run_dir).count(os.sep) + 1 >= _LS_DEPTH:
            dirs.clear()
        dirs.sort()


def _step(manifest: Manifest | None, folder: str) -> int | None:
    step = manifest.provenance.get("step") if manifest else None
    if type(step) is int:
        return step
    import re  # only ls needs it

    match = re.fullmatch(r"checkpoint[-_](\d+)", os.path.basename(os.path.normpath(folder)))
    return int(match.group(1)) if match else None


def _summary(manifest: Manifest, folder: str) -> dict[str, Any]:
    weight_tensors = manifest.weight_tensors()
    return {
        "identity": manifest.identity,
        "folder": os.path.abspath(folder),
        "weights": list(manifest.weights),
        "tensors": len(weight_tensors) if manifest.weights else len(manifest.tensors),
        "tensor_bytes": sum(t.data_offsets[1] - t.data_offsets[0] for t in weight_tensors.values()),
        "files": len(manifest.files),
        "bytes": sum(f.size for f in manifest.files),
        "config": dict(manifest.config),
        "provenance": dict(manifest.provenance),
    }


def _verify_json(report: VerifyReport, folder: str) -> dict[str, Any]:
    return {
        "folder": os.path.abspath(folder),
        "ok": report.ok,
        "identity": report.manifest.identity,
        "files_checked": len(report.checked),
        "tensors_checked": len(report.manifest.tensors),
        "problems": [
            {"path": p.path, "kind": p.kind, "detail": p.detail} | ({"tensor": p.tensor} if p.tensor else {})
            for p in report.problems
        ],
    }


def _diff_json(difference: ManifestDiff) -> dict[str, Any]:
    return {
        "same": difference.same,
        "identity_a": difference.identity_a,
        "identity_b": difference.identity_b,
        "changed": list(difference.changed),
        "added": list(difference.added),
        "removed": list(difference.removed),
        "config_changed": list(difference.config_changed),
    }


def _print_verify_lines(report: VerifyReport, *, quiet: bool) -> None:
    by_path: dict[str, list] = {}
    for problem in report.problems:
        by_path.setdefault(problem.path, []).append(problem)
    for path in sorted(set(report.checked) | set(by_path)):
        problems = by_path.get(path)
        if not problems:
            if not quiet:
                print(f"{_safe(path)}: OK")
            continue
        for p in problems:
            what = f"tensor {_safe(repr(p.tensor))} {p.detail}" if p.tensor else f"{p.kind}: {_safe(p.detail)}"
            print(f"{_safe(path)}: FAILED ({what})")


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit() and int(text) >= 1):
        raise ValueError(f"{text!r} is not a positive integer")
    return int(text)


DESCRIPTION = "BLAKE3 manifests for model checkpoints."
_FOLDER = ("folder", "the checkpoint folder")
_JSON = Option("--json", "print JSON instead of lines")
#: Options of the two commands that hash: the knobs of ``hashing.hash_spans``.
_HASHING = (
    Option("--threads", "hashing threads (default: one per CPU)", "N", _positive),
    Option("--no-mmap", "read with pread instead of mmap (spinning disks, some network file systems)"),
)
COMMANDS = (
    Command(
        "publish",
        "hash a checkpoint folder and write its ckptpub.json",
        _cmd_publish,
        (_FOLDER,),
        (
            *_HASHING,
            Option("--allow-no-weights", "publish a folder without *.safetensors weights (FSDP, DeepSpeed, .bin)"),
            Option("--allow-nested", "publish a folder that holds other checkpoints (checkpoint-N, manifests)"),
            _JSON,
        ),
    ),
    Command(
        "verify",
        "re-hash a folder and report every difference from its manifest",
        _cmd_verify,
        (_FOLDER,),
        (
            Option("--quiet", "print only failures"),
            Option("--expect-identity", "also fail unless the manifest's identity is ID", "ID"),
            *_HASHING,
            _JSON,
        ),
    ),
    Command("show", "print a checkpoint's identity and summary from its manifest", _cmd_show, (_FOLDER,), (_JSON,)),
    Command(
        "diff",
        "compare the model tensors of two manifests (no data is read)",
        _cmd_diff,
        (("a", "checkpoint folder or manifest file"), ("b", "checkpoint folder or manifest file")),
        (_JSON,),
    ),
    Command("ls", "list the published checkpoints of a training run", _cmd_ls, (("run_dir", "the run's output folder"),), (_JSON,)),
)


def _print_json(value: Any) -> None:
    import json  # only --json needs it (see strict_json for why it is not imported above)

    print(json.dumps(value, indent=2, sort_keys=True))


def _note(message: str) -> None:
    _to_stderr(f"ckptpub: {_safe(message)}")


def _fail(message: str) -> None:
    _to_stderr(f"ckptpub: error: {_safe(message)}")


def _to_stderr(line: str) -> None:
    """One line to stderr; a closed or full stderr loses the line, never the exit code."""
    if sys.stderr is None:  # closed at start-up (print would fall back to stdout)
        return
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _safe(text: str) -> str:
    """Escape control characters so a hostile file or tensor name cannot break lines or the terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"
