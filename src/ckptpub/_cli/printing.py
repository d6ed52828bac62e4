"""What the ``ckptpub`` commands print: lines for people, JSON-ready dicts for ``--json``.

Every name or path that comes from a checkpoint goes through ``one_line``: a hostile
file or tensor name can neither split a line nor reach the terminal as a control sequence.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterable
from typing import Any

from .._filesystem.hub_cache import HUB_KEY
from .._filesystem.scan import absolute_location
from .._format.canonical import canonical_json
from .._format.manifest import Manifest
from .._operations.diff import ManifestDiff
from .._operations.explain import base_hub_of, base_of, hub_name
from .._operations.verify import Problem, VerifyReport
from .._runs.runview import RunEntry
from ..errors import one_line


def print_run_table(entries: list[RunEntry]) -> None:
    print(f"{'STEP':>8}  {'IDENTITY':<19}  {'SIZE':>9}  {'BASE':<19}  {'NOTE':<7}  PATH")
    for e in entries:
        step = "-" if e.step is None else str(e.step)
        identity = "UNUSABLE" if e.status == "unusable" else short(e.identity) if e.identity else "-"
        size = "-" if e.size is None else gb(e.size)
        note = {"gone": "gone", "unusable": "error"}.get(
            e.status, "=prev" if e.same_as_previous else "adapter" if e.adapter else ""
        )
        base = short(e.base_identity) or "-"
        print(f"{step:>8}  {identity:<19}  {size:>9}  {base:<19}  {note:<7}  {one_line(e.path)}")
    _print_why_unusable(e.detail for e in entries if e.status == "unusable")


def _print_why_unusable(details: Iterable[str | None]) -> None:
    """After a view of a run, one ``# reason`` line per unusable checkpoint (each names its path)."""
    for detail in details:
        print(f"# {one_line(detail or '')}")


def print_diff_lines(difference: ManifestDiff, a: Manifest, b: Manifest) -> None:
    """Lineage first, then one line per group of tensors, then config keys: the answer in a few lines."""
    relation = difference.relation
    skip = None
    if relation in ("adapter_on_a", "adapter_on_b"):
        adapter, base, side = (b, a, "b") if relation == "adapter_on_a" else (a, b, "a")
        skip = "removed" if side == "b" else "added"
        print(
            f"lineage  {side} is an adapter on {'a' if side == 'b' else 'b'} "
            f"({_with_hub(short(base.identity), base_name(adapter, base))}): "
            f"its {adapter.model_tensor_count or adapter.tensor_count} tensors apply on top of that base"
        )
    elif relation in ("from_a", "from_b"):
        child, parent = ("b", "a") if relation == "from_a" else ("a", "b")
        name = base_name(b, a) if relation == "from_a" else base_name(a, b)
        print(f"lineage  {child} records {parent}{f' ({short_hub(name)})' if name else ''} as its base")
    elif relation == "same_base":
        print(f"lineage  a and b record the same base {_with_hub(short(base_of(a)), base_hub_of(a))}")
    whats = {c.what for c in difference.tensor_changes}
    everything = (
        not difference.added
        and not difference.removed
        and len(difference.changed) == (a.model_tensor_count or a.tensor_count)
    )
    if everything and len(whats) == 1 and len(difference.changed) > 1:  # a cast or a full fine-tune
        print(f"changed  all {len(difference.changed)} tensors: {whats.pop()}")
        skip = "changed"
    for group in difference.groups:
        if group.kind == skip:
            continue
        count = f" ({len(group.names)} tensors)" if len(group.names) > 1 else ""
        where = f" {group.where}" if group.where else ""
        print(f"{group.kind:<8} {one_line(group.pattern)}{where}: {group.what}{count}")
    print_config_lines(difference)


def print_config_lines(difference: ManifestDiff) -> None:
    """One line per config key that changed (marked when the identity does not count it), then the notes."""
    for change in difference.config_keys:
        old = json_value(change.old) if change.in_a else "(absent)"
        new = json_value(change.new) if change.in_b else "(absent)"
        inert = "" if change.changes_identity else " (does not change the identity)"
        print(f"config   {change.file}: {one_line(change.key)} {one_line(old)} -> {one_line(new)}{inert}")
    adapter_relation = difference.relation in ("adapter_on_a", "adapter_on_b")
    for note in difference.config_notes:
        if not (adapter_relation and " only in " in note):  # an adapter has its own config
            print(f"config   {one_line(note)}")


def print_tree(roots: list[dict[str, Any]], as_json: bool) -> None:
    """``base X -> steps``: each recorded base, then the checkpoints trained from it."""
    if as_json:
        print_json(roots)
        return
    for root in roots:
        base = root["base_identity"]
        if root.get("unusable"):
            print("unusable (its manifest cannot be used, so its base is unknown)")
        else:
            name = _with_hub(short(base), root.get("base_hub"))
            print(f"base {name} (not in this run)" if base else "(no base recorded)")
        _print_children(root["children"], "")
    _print_why_unusable(
        child["entry"]["detail"] for root in roots if root.get("unusable") for child in root["children"]
    )


def _print_children(nodes: list[dict[str, Any]], indent: str) -> None:
    for number, node in enumerate(nodes):
        last = number == len(nodes) - 1
        e = node["entry"]
        step = f"step {e['step']}" if e["step"] is not None else "-"
        marks = [m for m, on in (("adapter", e["adapter"]), ("=prev", e["same_as_previous"])) if on]
        identity = "UNUSABLE" if e["status"] == "unusable" else short(e["identity"])
        print(
            f"{indent}{'`-' if last else '|-'} {step:<10} {identity:<19}  {one_line(e['path'])}"
            + (f"  ({', '.join(marks)})" if marks else "")
        )
        _print_children(node["children"], indent + ("   " if last else "|  "))


def print_verify_lines(report: VerifyReport, *, quiet: bool) -> None:
    by_path: dict[str, list[Problem]] = {}
    for problem in report.problems:
        by_path.setdefault(problem.path, []).append(problem)
    for path in sorted(set(report.checked) | set(by_path)):
        problems = by_path.get(path)
        if not problems:
            if not quiet:
                print(f"{one_line(path)}: OK")
            continue
        for p in problems:
            what = (
                f"tensor {one_line(repr(p.tensor))} {p.detail}"
                if p.tensor
                else f"{p.kind}: {one_line(p.detail)}"
            )
            print(f"{one_line(path)}: FAILED ({what})")


def base_name(child: Manifest, base: Manifest) -> str | None:
    """The base by hub id and short commit: as the child recorded it, or as the base's own manifest says."""
    return base_hub_of(child) or hub_name(base.provenance.get(HUB_KEY))


def _with_hub(text: str, hub: str | None) -> str:
    """``text``, then the hub name when there is one (``short_hub``)."""
    return f"{text} {short_hub(hub)}" if hub else text


def short_hub(hub: str) -> str:
    """``org/name@<12 hex of the commit>``, on one line (provenance is untrusted text)."""
    repo_id, _, revision = hub.rpartition("@")
    return one_line(f"{repo_id}@{revision[:12]}")


def manifest_summary(manifest: Manifest, folder: str) -> dict[str, Any]:
    weight_files = set(manifest.weights)
    return {
        "identity": manifest.identity,
        "folder": absolute_location(folder),
        "weights": list(manifest.weights),
        "tensors": manifest.model_tensor_count if manifest.weights else manifest.tensor_count,
        # A weight file's tensors tile its data region, so their bytes are the file less its header.
        "tensor_bytes": sum(f.size - (f.header_size or 0) for f in manifest.files if f.path in weight_files),
        "files": len(manifest.files),
        "bytes": sum(f.size for f in manifest.files),
        "config": dict(manifest.config),
        "provenance": dict(manifest.provenance),
    }


def verify_json(report: VerifyReport, folder: str) -> dict[str, Any]:
    return {
        "folder": absolute_location(folder),
        "ok": report.ok,
        "identity": report.manifest.identity,
        "files_checked": len(report.checked),
        "tensors_checked": report.manifest.tensor_count,
        "problems": [
            {"path": p.path, "kind": p.kind, "detail": p.detail} | ({"tensor": p.tensor} if p.tensor else {})
            for p in report.problems
        ],
    }


def diff_json(difference: ManifestDiff, a: Manifest, b: Manifest) -> dict[str, Any]:
    return {
        "same": difference.same,
        "identity_a": difference.identity_a,
        "identity_b": difference.identity_b,
        "base_identity_a": base_of(a),
        "base_identity_b": base_of(b),
        "base_hub_a": base_hub_of(a),
        "base_hub_b": base_hub_of(b),
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


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def note(message: str) -> None:
    to_stderr(f"ckptpub: {one_line(message)}")


def to_stderr(line: str) -> None:
    """One line to stderr; a closed or full stderr loses the line, never the exit code."""
    if sys.stderr is None:  # closed at start-up (print would fall back to stdout)
        return
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def short(identity: str | None) -> str:
    """``blake3:1a2b3c4d5e6f``: enough to tell a run's checkpoints apart; ``--json`` has the whole digest."""
    return identity[:19] if identity else ""


def value_text(value: object) -> str:
    """A provenance value for people: strings as they are, the rest as JSON (``null``, never ``None``)."""
    return value if isinstance(value, str) else json_value(value)


def json_value(value: object) -> str:
    """A config or provenance value in the manifest's own (canonical) JSON form."""
    try:
        return canonical_json(value).decode("utf-8")
    except (TypeError, ValueError, RecursionError):
        return "(too deeply nested to print)"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def gb(size: int) -> str:
    if size >= 1e8:
        return f"{size / 1e9:.2f} GB"
    if size >= 1e5:
        return f"{size / 1e6:.1f} MB"
    return f"{size / 1e3:.1f} kB"
