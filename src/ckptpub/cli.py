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

    sign = _signing_key(args)
    bar = ProgressBar("hashing")
    try:
        manifest = publish(
            args.folder,
            threads=args.threads,
            use_mmap=not args.no_mmap,
            on_progress=bar,
            allow_no_weights=args.allow_no_weights,
            allow_nested=args.allow_nested,
            base=args.base,
            adapter=args.adapter,
            sign=sign,
        )
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
        raise CkptpubError(
            f"published {os.path.join(args.folder, MANIFEST_NAME)} (identity {manifest.identity}), "
            f"but could not write to stdout: {getattr(error, 'strerror', None) or error}"
        ) from None
    _note(
        f"published {os.path.join(args.folder, MANIFEST_NAME)}: {len(manifest.tensors)} tensors, "
        f"{len(manifest.files)} files, {_gb(sum(f.size for f in manifest.files))}"
    )
    return EXIT_OK


def _cmd_verify(args: Arguments) -> int:
    from .compare import verify

    trusted = _trusted_key(args)
    bar = ProgressBar("verifying")
    options: dict[str, Any] = {
        "expect_identity": args.expect_identity,
        "threads": args.threads,
        "use_mmap": not args.no_mmap,
        "on_progress": bar,
    }
    try:
        if trusted is None:
            report = verify(args.folder, **options)
        else:  # the signature first: it must cover exactly the manifest verified
            from .signing import verify_signed

            report = verify_signed(args.folder, trusted, **options)
    finally:
        bar.close()
    if args.json:
        _print_json(_verify_json(report, args.folder))
    else:
        _print_verify_lines(report, quiet=args.quiet)
    tensors = len(report.manifest.tensors)
    if report.ok:
        _note(
            f"{args.folder}: OK, {len(report.checked)} files, {tensors} tensors, identity {report.manifest.identity}"
        )
        return EXIT_OK
    changed = sum(p.kind == "tensor" for p in report.problems)
    _note(
        f"{args.folder}: FAILED, {_plural(len(report.problems), 'problem')} ({_plural(changed, 'tensor')} changed) in {_plural(len(report.checked), 'file')}"
    )
    return EXIT_MISMATCH


def _cmd_show(args: Arguments) -> int:
    from .explain import base_of, is_adapter

    manifest = read_manifest(args.folder)
    summary = _summary(manifest, args.folder)
    if args.json:
        _print_json(summary)
        return EXIT_OK
    base = base_of(manifest)
    kind = "adapter" if is_adapter(manifest) else "model"
    rows = [
        ("identity", manifest.identity),
        ("kind", f"{kind} on base {base}" if base else f"{kind} (no base recorded)"),
        ("folder", os.path.abspath(args.folder)),
        ("weights", ", ".join(manifest.weights) or "(none: identity covers every file)"),
        ("tensors", f"{summary['tensors']} ({_gb(summary['tensor_bytes'])})"),
        ("files", f"{summary['files']} ({_gb(summary['bytes'])})"),
        *(("config", f"{name} {digest}") for name, digest in sorted(manifest.config.items())),
        *((key, _value(value)) for key, value in sorted(manifest.provenance.items())),
    ]
    width = max(len(key) for key, _ in rows) + 2
    for key, value in rows:
        print(f"{key + ':':<{width}}{_safe(value)}")
    return EXIT_OK


def _cmd_diff(args: Arguments) -> int:
    from .compare import diff_manifests

    a, b = read_manifest(args.a), read_manifest(args.b)
    folders = [path if os.path.isdir(path) else None for path in (args.a, args.b)]
    difference = diff_manifests(a, b, folder_a=folders[0], folder_b=folders[1])
    if args.json:
        _print_json(_diff_json(difference, a, b))
    elif difference.same:
        print(f"same identity {difference.identity_a}")
    else:
        _print_diff_lines(difference, a, b)
    if not difference.same:
        _note(
            f"different identities: {len(difference.changed)} tensors changed, {len(difference.added)} added, "
            f"{len(difference.removed)} removed, {_plural(len(difference.config_changed), 'config')} changed"
        )
    return EXIT_OK if difference.same else EXIT_MISMATCH


def _print_diff_lines(difference: ManifestDiff, a: Manifest, b: Manifest) -> None:
    """Lineage first, then one line per group of tensors, then config keys: the answer in a few lines."""
    relation = difference.relation
    skip = None
    if relation in ("adapter_on_a", "adapter_on_b"):
        adapter, base, side = (b, a, "b") if relation == "adapter_on_a" else (a, b, "a")
        skip = "removed" if side == "b" else "added"
        print(
            f"lineage  {side} is an adapter on {'a' if side == 'b' else 'b'} ({_short(base.identity)}): "
            f"its {len(adapter.weight_tensors() or adapter.tensors)} tensors apply on top of that base"
        )
    elif relation in ("from_a", "from_b"):
        child, parent = ("b", "a") if relation == "from_a" else ("a", "b")
        print(f"lineage  {child} records {parent} as its base")
    elif relation == "same_base":
        print(f"lineage  a and b record the same base {_short(a.provenance['base_identity'])}")
    whats = {c.what for c in difference.tensor_changes}
    everything = (
        not difference.added
        and not difference.removed
        and len(difference.changed) == len(a.weight_tensors() or a.tensors)
    )
    if (
        everything and len(whats) == 1 and len(difference.changed) > 1
    ):  # a cast or a full fine-tune: one line says it
        print(f"changed  all {len(difference.changed)} tensors: {whats.pop()}")
        skip = "changed"
    for group in difference.groups:
        if group.kind == skip:
            continue
        count = f" ({len(group.names)} tensors)" if len(group.names) > 1 else ""
        where = f" {group.where}" if group.where else ""
        print(f"{group.kind:<8} {_safe(group.pattern)}{where}: {group.what}{count}")
    for change in difference.config_keys:
        old = _json_value(change.old) if change.in_a else "(absent)"
        new = _json_value(change.new) if change.in_b else "(absent)"
        print(f"config   {change.file}: {_safe(change.key)} {_safe(old)} -> {_safe(new)}")
    for note in difference.config_notes:
        if not (
            relation in ("adapter_on_a", "adapter_on_b") and " only in " in note
        ):  # an adapter has its own config
            print(f"config   {_safe(note)}")


def _cmd_ls(args: Arguments) -> int:
    from .runview import lineage, list_run

    entries = list_run(args.run_dir)
    unusable = sum(e.status == "unusable" for e in entries)
    if args.tree:
        _print_tree(lineage(entries), args.json)
    elif args.json:
        _print_json([e.as_dict() for e in entries])
    else:
        print(f"{'STEP':>8}  {'IDENTITY':<19}  {'SIZE':>9}  {'BASE':<19}  {'NOTE':<7}  PATH")
        for e in entries:
            step = "-" if e.step is None else str(e.step)
            identity = "UNUSABLE" if e.status == "unusable" else _short(e.identity) if e.identity else "-"
            size = "-" if e.size is None else _gb(e.size)
            note = {"gone": "gone", "unusable": "error"}.get(
                e.status, "=prev" if e.same_as_previous else "adapter" if e.adapter else ""
            )
            print(
                f"{step:>8}  {identity:<19}  {size:>9}  {_short(e.base_identity) or '-':<19}  {note:<7}  {_safe(e.path)}"
            )
        for e in entries:
            if e.status == "unusable":
                print(f"# {_safe(e.detail or '')}")
    published = sum(e.status == "ok" for e in entries)
    gone = sum(e.status == "gone" for e in entries)
    _note(
        f"{_plural(published, 'published checkpoint')} under {args.run_dir}"
        + (f", {gone} rotated away" if gone else "")
        + (f", {unusable} unusable" if unusable else "")
    )
    return EXIT_UNUSABLE if unusable else EXIT_OK


def _cmd_log(args: Arguments) -> int:
    from .runview import lineage, list_run

    entries = list_run(args.run_dir)
    _print_tree(lineage(entries), args.json)
    return EXIT_UNUSABLE if any(e.status == "unusable" for e in entries) else EXIT_OK


def _print_tree(roots: list[dict], as_json: bool) -> None:
    """``base X -> steps``: each recorded base, then the checkpoints trained from it."""
    if as_json:
        _print_json(roots)
        return
    for root in roots:
        base = root["base_identity"]
        print(f"base {_short(base)} (not in this run)" if base else "(no base recorded)")
        _print_children(root["children"], "")


def _print_children(nodes: list[dict], indent: str) -> None:
    for number, node in enumerate(nodes):
        last = number == len(nodes) - 1
        e = node["entry"]
        step = f"step {e['step']}" if e["step"] is not None else "-"
        marks = [m for m, on in (("adapter", e["adapter"]), ("=prev", e["same_as_previous"])) if on]
        print(
            f"{indent}{'`-' if last else '|-'} {step:<10} {_short(e['identity'])}  {_safe(e['path'])}"
            + (f"  ({', '.join(marks)})" if marks else "")
        )
        _print_children(node["children"], indent + ("   " if last else "|  "))


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


def _diff_json(difference: ManifestDiff, a: Manifest, b: Manifest) -> dict[str, Any]:
    from .explain import base_of

    return {
        "same": difference.same,
        "identity_a": difference.identity_a,
        "identity_b": difference.identity_b,
        "base_identity_a": base_of(a),
        "base_identity_b": base_of(b),
        "relation": difference.relation,
        "changed": list(difference.changed),
        "added": list(difference.added),
        "removed": list(difference.removed),
        "config_changed": list(difference.config_changed),
        "tensor_changes": [c._asdict() | {"what": c.what} for c in difference.tensor_changes],
        "groups": [g._asdict() | {"where": g.where, "count": len(g.names)} for g in difference.groups],
        "config_keys": [c._asdict() for c in difference.config_keys],
        "config_notes": list(difference.config_notes),
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
            what = (
                f"tensor {_safe(repr(p.tensor))} {p.detail}" if p.tensor else f"{p.kind}: {_safe(p.detail)}"
            )
            print(f"{_safe(path)}: FAILED ({what})")


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit() and int(text) >= 1):
        raise ValueError(f"{text!r} is not a positive integer")
    return int(text)


DESCRIPTION = "BLAKE3 manifests for model checkpoints."
_FOLDER = ("folder", "the checkpoint folder")
_JSON = Option("--json", "print JSON instead of lines")
_RUN = ("run_dir", "the run's output folder")
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
            Option(
                "--allow-no-weights", "publish a folder without *.safetensors weights (FSDP, DeepSpeed, .bin)"
            ),
            Option(
                "--allow-nested", "publish a folder that holds other checkpoints (checkpoint-N, manifests)"
            ),
            Option(
                "--base",
                "record the model this one was made from (a published folder or an identity)",
                "DIR|ID",
            ),
            Option(
                "--adapter",
                "record the adapter merged into this model (a published folder or an identity)",
                "DIR|ID",
            ),
            Option("--sign", "also write model.sig, signed with this ECDSA private key (PEM)", "KEY"),
            Option("--signing-certificate", "with --sign: sign as this certificate's holder (PEM)", "CERT"),
            Option("--certificate-chain", "with --signing-certificate: its chain (PEM, one file)", "PEM"),
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
            Option("--public-key", "also fail unless model.sig signs exactly this manifest with PUB", "PUB"),
            Option("--certificate-chain", "as --public-key, trusting the chain's root (PEM)", "PEM"),
            *_HASHING,
            _JSON,
        ),
    ),
    Command(
        "show", "print a checkpoint's identity and summary from its manifest", _cmd_show, (_FOLDER,), (_JSON,)
    ),
    Command(
        "diff",
        "compare the model tensors of two manifests (no data is read)",
        _cmd_diff,
        (("a", "checkpoint folder or manifest file"), ("b", "checkpoint folder or manifest file")),
        (_JSON,),
    ),
    Command(
        "ls",
        "list the published checkpoints of a training run (its run index, then a folder scan)",
        _cmd_ls,
        (_RUN,),
        (Option("--tree", "show the run's lineage, as 'ckptpub log' does"), _JSON),
    ),
    Command(
        "log",
        "show a training run's lineage: each recorded base, then the steps trained from it",
        _cmd_log,
        (_RUN,),
        (_JSON,),
    ),
)


def _signing_key(args: Arguments) -> Any:
    """``--sign KEY`` (with ``--signing-certificate``/``--certificate-chain``) as ``publish(sign=...)``."""
    if args.sign is None and args.signing_certificate is None and args.certificate_chain is None:
        return None
    if args.sign is None:
        raise CkptpubError("--signing-certificate and --certificate-chain need --sign KEY")
    from .signing import SigningKey

    chain = () if args.certificate_chain is None else (args.certificate_chain,)
    return SigningKey(args.sign, args.signing_certificate, chain)


def _trusted_key(args: Arguments) -> Any:
    """``--public-key PUB`` or ``--certificate-chain PEM`` as a ``signing.TrustedKey`` (None: neither)."""
    if args.public_key is None and args.certificate_chain is None:
        return None
    from .signing import TrustedKey

    chain = () if args.certificate_chain is None else (args.certificate_chain,)
    return TrustedKey(args.public_key, chain)


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


def _short(identity: str | None) -> str:
    """``blake3:1a2b3c4d5e6f``: enough to tell a run's checkpoints apart; ``--json`` has the whole digest."""
    return identity[:19] if identity else ""


def _value(value: object) -> str:
    """A provenance value for people: strings as they are, the rest as JSON (``null``, never ``None``)."""
    return value if isinstance(value, str) else _json_value(value)


def _json_value(value: object) -> str:
    from .canonical import canonical_json  # not the json package: diff stays off re/enum

    try:
        return canonical_json(value).decode("utf-8")
    except (TypeError, ValueError, RecursionError):
        return "(too deeply nested to print)"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _gb(size: int) -> str:
    return (
        f"{size / 1e9:.2f} GB"
        if size >= 1e8
        else f"{size / 1e6:.1f} MB"
        if size >= 1e5
        else f"{size / 1e3:.1f} kB"
    )
