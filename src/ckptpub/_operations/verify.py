"""Verify a folder's bytes against its manifest: ``verify``, and the records it returns.

It returns data (``VerifyReport``, a ``Problem`` per difference) rather than raising
on a difference: a difference is a result, and callers (the CLI, the vLLM loader,
the daemon supervisor) decide what to do with it. ``CkptpubError`` is reserved for
input that cannot be used at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NamedTuple

from .._filesystem.model_files import claim_problems, is_shard_path, read_layouts
from .._filesystem.read import read_manifest
from .._filesystem.scan import FolderEntry, resolve_folder, scan_folder
from .._format.manifest import Manifest, check_identity
from .._format.names import MANIFEST_NAME
from .._format.records import FileRecord, ShardTensors
from .._format.safetensors import ShardLayout
from .._hashing.engine import ProgressCallback, Span, tensor_spans
from .._hashing.options import HashOptions, SpanHasher
from ..errors import CkptpubError


class Problem(NamedTuple):
    """One difference between the folder and its manifest.

    ``kind`` is one of ``missing``, ``added``, ``size``, ``changed`` (a whole file),
    ``header`` (a shard's header), ``tensor`` (``tensor`` names it), ``manifest``
    (the manifest claims weights or a config the folder does not have) or
    ``identity`` (not the identity the caller expected).
    """

    path: str
    kind: str
    detail: str
    tensor: str | None = None


class VerifyReport(NamedTuple):
    """The outcome of ``verify``: the manifest's files that were checked, and every problem found.

    ``checked`` holds the files found in the folder and compared with the manifest; a
    file the manifest lists but the folder lacks is a ``missing`` problem, not checked.
    """

    manifest: Manifest
    checked: tuple[str, ...]
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(
    folder: str | os.PathLike[str],
    *,
    expect_identity: str | None = None,
    threads: int | None = None,
    use_mmap: bool = True,
    on_progress: ProgressCallback | None = None,
    hasher: SpanHasher | None = None,
) -> VerifyReport:
    """Re-hash every byte of ``folder`` and compare with its ``ckptpub.json``.

    With ``expect_identity``, a manifest of any other identity is a problem too,
    which turns "the folder matches its manifest" into "the folder is this model".
    The manifest's claims about which files are shards and weights, and about the
    config, are checked against the folder with the rules ``publish`` applies
    (``model_files.claim_problems``), so a forged manifest cannot keep a pinned
    identity while an engine loads other tensors. ``hasher`` hashes instead of this
    process's threads (a ``distributed.DistributedHasher`` spreads the work over a job's ranks).
    """
    if expect_identity is not None:
        check_identity(expect_identity, "expected identity")
    hashing = HashOptions.checked(threads, use_mmap, on_progress, hasher)
    root = resolve_folder(folder)
    manifest = read_manifest(root)
    entries = {e.path: e for e in scan_folder(root)}
    problems: list[Problem] = []
    checks = _Checks()
    layouts: dict[str, ShardLayout] = {}
    headers = read_layouts(
        [entries[r.path] for r in manifest.files if r.header_size is not None and _same_size(entries, r)]
    )
    for record in manifest.files:
        entry = entries.get(record.path)
        if entry is None:
            problems.append(Problem(record.path, "missing", "in the manifest but not in the folder"))
        elif entry.size != record.size:
            problems.append(Problem(record.path, "size", f"{entry.size} bytes, manifest says {record.size}"))
        elif record.header_size is None:
            span = Span(entry.real_path, 0, entry.size, record.path, entry.file_id)
            checks.add(span, record.digest, Problem(record.path, "changed", "content differs"))
        else:
            checks.add_shard(manifest.shards()[record.path], entry)
            layout = headers[record.path]
            if isinstance(layout, CkptpubError):
                problems.append(Problem(record.path, "header", str(layout).removeprefix(f"{record.path}: ")))
            else:
                layouts[record.path] = layout
    for path in entries.keys() - {f.path for f in manifest.files}:
        problems.append(Problem(path, "added", "in the folder but not in the manifest"))
    problems.extend(checks.mismatches(hashing.span_digests(checks.spans)))
    if not problems:
        problems.extend(_claims(manifest, entries, layouts))
    if expect_identity is not None and manifest.identity != expect_identity:
        problems.append(
            Problem(
                MANIFEST_NAME,
                "identity",
                f"identity {manifest.identity} is not the expected {expect_identity}",
            )
        )
    problems.sort(key=lambda p: (p.path, p.tensor or ""))
    checked = tuple(f.path for f in manifest.files if f.path in entries)
    return VerifyReport(manifest, checked, tuple(problems))


def _same_size(entries: dict[str, FolderEntry], record: FileRecord) -> bool:
    """Whether the folder has the record's file at the recorded size (only then are its contents checked)."""
    entry = entries.get(record.path)
    return entry is not None and entry.size == record.size


class _Checks:
    """What ``verify`` hashes, and what each digest must be; a ``Problem`` is made only for a mismatch.

    A 100k-tensor checkpoint has 100k checks: a shard's spans are made from the
    manifest's columns in one pass (``add_shard``), and its expected digests are the
    manifest's own, so memory stays near the manifest's.
    """

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._expected: list[str] = []
        self._problems: dict[int, Problem] = {}  # by span index; any other span is a tensor's

    def add(self, span: Span, digest: str, problem: Problem) -> None:
        self._problems[len(self.spans)] = problem
        self.spans.append(span)
        self._expected.append(digest)

    def add_shard(self, tensors: ShardTensors, entry: FolderEntry) -> None:
        """The shard's header, then each tensor where the manifest places it.

        ``verify`` parses the header too, so a manifest that places tensors where the
        header does not is caught even when every hashed range matches.
        """
        path, header_size = tensors.shard.path, tensors.shard.header_size or 0
        self.add(
            Span(entry.real_path, 0, header_size, path, entry.file_id),
            tensors.shard.digest,
            Problem(path, "header", "safetensors header differs"),
        )
        places = (tensors.columns.names, tensors.begins(), tensors.ends)
        self.spans += tensor_spans(entry.real_path, path, entry.file_id, header_size, places)
        self._expected += tensors.columns.digests()

    def mismatches(self, digests: list[str]) -> Iterator[Problem]:
        if digests == self._expected:
            return
        for index, (got, want) in enumerate(zip(digests, self._expected, strict=True)):
            if got != want:
                span = self.spans[index]
                yield self._problems.get(index) or Problem(span.name, "tensor", "bytes differ", span.tensor)


def _claims(
    manifest: Manifest, entries: dict[str, FolderEntry], layouts: dict[str, ShardLayout]
) -> list[Problem]:
    """With every byte matching, the manifest's shards, weights and config must be the folder's own.

    Shards the manifest lists as plain files are parsed here too: the rule needs
    the layout of every file ``publish`` would parse.
    """
    problems = []
    unparsed = [entry for path, entry in entries.items() if is_shard_path(path) and path not in layouts]
    for path, layout in read_layouts(unparsed).items():
        if isinstance(layout, CkptpubError):
            problems.append(
                Problem(path, "manifest", f"not a valid safetensors file, which publish refuses: {layout}")
            )
        else:
            layouts[path] = layout
    problems.extend(
        Problem(path, "manifest", detail) for path, detail in claim_problems(manifest, entries, layouts)
    )
    return problems
