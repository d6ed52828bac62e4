"""A training run at a glance: its published checkpoints (``ckptpub ls``) and their lineage (``ckptpub log``).

The run index (``ckptpub-index.jsonl``, see ``run_index``) says what was published,
in order, with each step and identity, including checkpoints rotated away since. A
folder scan finds what the index does not name (a run without the callback, a
``final`` model published by hand). Each listed folder's manifest is read: a
checkpoint is never trusted on the index's word alone, and never left out silently.

A listing reads what it shows and checks that: each manifest's first line, field by
field and byte for byte, and its identity recomputed from its entries' bytes (one
BLAKE3 pass, ``check_tables=False``); not each tensor entry, which no listing shows
and ``verify``, ``diff`` and engines check. At 100k tensors that is milliseconds a
step instead of a third of a second (docs/format.md, "What each reader checks").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from .._filesystem import run_index
from .._filesystem.objects import READ_THREADS, ObjectUrl, is_object_url, list_objects
from .._filesystem.read import read_manifest
from .._format.names import MANIFEST_NAME, RUN_INDEX_NAME
from .._operations.explain import base_hub_of, base_of, is_adapter
from ..errors import CkptpubError

#: How deep the scan looks for checkpoint folders (``run/trial/checkpoint-N`` is 2).
SCAN_DEPTH = 3


class RunEntry(NamedTuple):
    """One checkpoint of a run.

    ``status``: ``ok``; ``gone`` (the index names it, the folder was rotated away);
    ``unusable`` (its manifest cannot be read, or its identity is not the one the
    index recorded: ``detail`` says which). ``same_as_previous``: an ``ok`` step
    with the identity of the ``ok`` step before it (a re-save of unchanged weights).
    """

    path: str
    step: int | None
    identity: str | None
    size: int | None
    base_identity: str | None
    adapter: bool
    source: str
    status: str
    detail: str | None = None
    same_as_previous: bool = False
    base_hub: str | None = None  # the base by hub id and commit, when the manifest records it

    def as_dict(self) -> dict[str, Any]:
        return dict(self._asdict())


def list_run(run_dir: str) -> list[RunEntry]:
    """Every checkpoint of ``run_dir`` (a folder, or an ``s3://`` prefix) the index names or a scan finds,
    by step."""
    layout = _object_run(run_dir) if is_object_url(run_dir) else _folder_run(run_dir)
    entries: dict[str, RunEntry] = {}
    try:
        records = run_index.read(run_dir)
    except CkptpubError as error:
        records = []
        entries[RUN_INDEX_NAME] = RunEntry(
            RUN_INDEX_NAME, None, None, None, None, False, "index", "unusable", str(error)
        )
    wanted: dict[str, tuple[int | None, str, str | None]] = {}
    for record in records:  # a path published twice keeps its last record
        wanted[record["path"]] = (record["step"], "index", record["identity"])
    for path in layout.published:
        wanted.setdefault(path, (None, "scan", None))
    entries.update(zip(wanted, _entries(run_dir, layout, wanted), strict=True))
    for path, why in layout.unlisted:
        entries[path] = RunEntry(
            path, _step_from_name(path), None, None, None, False, "scan", "unusable", why
        )
    ordered = sorted(entries.values(), key=lambda e: (e.step is None, e.step or 0, e.path))
    previous = None
    for number, entry in enumerate(ordered):
        if entry.status == "ok":
            if previous is not None and previous.identity == entry.identity:
                ordered[number] = entry = entry._replace(same_as_previous=True)
            previous = entry
    return ordered


def lineage(entries: list[RunEntry]) -> list[dict[str, Any]]:
    """The run as a forest: each recorded base, then what was trained from it.

    A checkpoint whose base is another checkpoint of this run (a merge of step 40
    published with ``--base``) hangs under that one; bases outside the run are roots.
    Unusable checkpoints, whose base cannot be known, are the children of one last
    root marked ``"unusable": true``: no view of a run leaves a checkpoint out
    silently (rotated ones are left out: ``ls`` lists them).
    """
    nodes: dict[str | None, dict[str, Any]] = {}
    roots: list[dict[str, Any]] = []
    outside: dict[str | None, dict[str, Any]] = {}
    for entry in entries:
        if entry.status != "ok":
            continue
        node: dict[str, Any] = {"entry": entry.as_dict(), "children": []}
        parent = nodes.get(entry.base_identity) if entry.base_identity != entry.identity else None
        if parent is None:
            parent = outside.get(entry.base_identity)
            if parent is None:
                parent = outside[entry.base_identity] = {
                    "base_identity": entry.base_identity,
                    "base_hub": entry.base_hub,
                    "children": [],
                }
                roots.append(parent)
        parent["children"].append(node)
        nodes.setdefault(entry.identity, node)
    unusable = [{"entry": e.as_dict(), "children": []} for e in entries if e.status == "unusable"]
    if unusable:
        roots.append({"base_identity": None, "unusable": True, "children": unusable})
    return roots


class _RunLayout(NamedTuple):
    """What a run's storage says before any manifest is read: where manifests are, what is there at all."""

    published: list[str]  # folders holding a manifest, relative to the run folder
    unlisted: list[tuple[str, str]]  # (folder, why): folders that cannot be listed
    exists: Callable[[str], bool]  # whether anything is at a relative path (an index record's folder)
    through_link: Callable[[str], bool]  # whether a relative path passes a symlink


def _folder_run(run_dir: str) -> _RunLayout:
    if not os.path.isdir(run_dir):
        raise CkptpubError(f"{run_dir}: not a folder")
    unlisted: list[OSError] = []
    published = [
        os.path.relpath(folder, run_dir).replace(os.sep, "/")
        for folder in _published_folders(run_dir, unlisted.append)
    ]
    failures = []
    for failure in unlisted:
        path = os.path.relpath(failure.filename or run_dir, run_dir)
        failures.append((path, f"{path}: cannot list folder: {failure.strerror or failure}"))
    return _RunLayout(
        published,
        failures,
        lambda path: os.path.lexists(os.path.join(run_dir, path)),
        lambda path: _through_link(run_dir, path),
    )


def _object_run(run_dir: str) -> _RunLayout:
    """A run below an ``s3://`` prefix, from one listing: each ``.../ckptpub.json`` at most ``SCAN_DEPTH``
    down (not inside another checkpoint), and which folders hold anything."""
    paths = [entry.path for entry in list_objects(ObjectUrl.parse(run_dir))]
    folders = {path.rpartition("/")[0] for path in paths if path.endswith("/" + MANIFEST_NAME)}
    published = sorted(
        folder
        for folder in folders
        if folder.count("/") < SCAN_DEPTH
        and not any(folder.startswith(other + "/") for other in folders if other != folder)
    )
    present = {"/".join(path.split("/")[:depth]) for path in paths for depth in range(1, path.count("/") + 1)}
    return _RunLayout(published, [], present.__contains__, lambda path: False)


def _entries(
    run_dir: str, layout: _RunLayout, wanted: dict[str, tuple[int | None, str, str | None]]
) -> list[RunEntry]:
    """``_entry`` of each wanted folder, in order: ``READ_THREADS`` at a time in object storage, where each
    manifest is a round trip; in turn in a folder."""

    def entry(item: tuple[str, tuple[int | None, str, str | None]]) -> RunEntry:
        path, (step, source, indexed) = item
        return _entry(run_dir, layout, path, step, source, indexed)

    if not is_object_url(run_dir):
        return [entry(item) for item in wanted.items()]
    with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="ckptpub-ls") as pool:
        return list(pool.map(entry, wanted.items()))


def _entry(
    run_dir: str, layout: _RunLayout, path: str, step: int | None, source: str, indexed: str | None
) -> RunEntry:
    folder = os.path.join(run_dir, path)

    def unreadable(status: str, detail: str, known_step: int | None = step) -> RunEntry:
        return RunEntry(path, known_step, indexed, None, None, False, source, status, detail)

    if source == "index" and not layout.exists(path):
        return unreadable("gone", "rotated away or deleted")
    # The scan does not follow links; nor does the index.
    if source == "index" and layout.through_link(path):
        return unreadable(
            "unusable", f"{path}: reached through a symlink; not followed out of the run folder"
        )
    try:
        manifest = read_manifest(folder, check_tables=False)  # every field shown is checked
    except CkptpubError as error:
        return unreadable("unusable", str(error), step if step is not None else _step_from_name(path))
    if step is None:
        recorded = manifest.provenance.get("step")
        step = recorded if type(recorded) is int else _step_from_name(path)
    size = sum(f.size for f in manifest.files)
    entry = RunEntry(
        path,
        step,
        manifest.identity,
        size,
        base_of(manifest),
        is_adapter(manifest),
        source,
        "ok",
        base_hub=base_hub_of(manifest),
    )
    if indexed is not None and indexed != manifest.identity:
        return entry._replace(
            status="unusable",
            detail=f"{path}: {MANIFEST_NAME} has identity {manifest.identity}, "
            f"the run index recorded {indexed}",
        )
    return entry


def _through_link(run_dir: str, path: str) -> bool:
    parts = path.split("/")
    return any(os.path.islink(os.path.join(run_dir, *parts[:n])) for n in range(1, len(parts) + 1))


def _published_folders(run_dir: str, on_error: Callable[[OSError], object]) -> Iterator[str]:
    """Folders holding a manifest, at most ``SCAN_DEPTH`` levels down, not inside another checkpoint.

    The run folder itself is looked into even when it holds a manifest (a stray
    ``ckptpub publish RUN_DIR`` must not hide the run's checkpoints). Folders that
    cannot be listed go to ``on_error``: a checkpoint is never left out silently.
    """
    for current, dirs, files in os.walk(run_dir, onerror=on_error):
        if MANIFEST_NAME in files or MANIFEST_NAME in dirs:
            yield current
            if current != run_dir:
                dirs.clear()
        if os.path.relpath(current, run_dir).count(os.sep) + 1 >= SCAN_DEPTH:
            dirs.clear()
        dirs.sort()


def _step_from_name(path: str) -> int | None:
    """``checkpoint-10`` -> 10; None for a name without a step."""
    name = os.path.basename(os.path.normpath(path))
    for prefix in ("checkpoint-", "checkpoint_"):
        number = name[len(prefix) :]
        if name.startswith(prefix) and number.isascii() and number.isdigit():
            return int(number)
    return None
