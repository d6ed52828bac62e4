"""Verify a folder's bytes against its manifest, and diff two manifests.

Both return data (``VerifyReport``, ``ManifestDiff``) rather than raising on a
difference: a difference is a result, and callers (the CLI, the vLLM loader, the
daemon supervisor) decide what to do with it. ``CkptpubError`` is reserved for
input that cannot be used at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

from .errors import CkptpubError
from .explain import (
    ConfigChange,
    TensorChange,
    TensorGroup,
    compare_configs,
    group_tensors,
    relation,
    tensor_change,
)
from .hashing import ProgressCallback, Span, hash_spans
from .manifest import MANIFEST_NAME, FileRecord, Manifest, ModelEntry, TensorRecord, check_identity
from .model_files import claim_problems, is_shard_path
from .read import read_manifest
from .safetensors import ShardLayout, read_layout
from .scan import FolderEntry, as_path, resolve_folder, scan_folder

if TYPE_CHECKING:
    from .distributed import SpanHasher


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
    """The outcome of ``verify``: every file checked, and every problem found."""

    manifest: Manifest
    checked: tuple[str, ...]
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


class ManifestDiff(NamedTuple):
    """Model tensors whose bytes, dtype or shape differ (``changed``), or that only one side has.

    The rest explains the difference (see ``explain``): ``tensor_changes`` says what
    differs in each changed tensor, ``groups`` names changed, added and removed
    tensors by pattern ("self_attn.{q,v}_proj.weight in layers 0-27"),
    ``config_changed`` the config files whose meaning differs (``explain.compare_configs``),
    ``config_keys`` the config keys whose values differ, each marked with whether the
    identity counts it (read from the folders' files when both were given as folders;
    ``config_notes`` says why not otherwise),
    and ``relation`` how the two are linked by their recorded base
    (``explain.relation``: ``adapter_on_a``, ``from_a``, ``same_base``, ... or None).
    """

    identity_a: str
    identity_b: str
    changed: tuple[str, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]
    config_changed: tuple[str, ...]
    tensor_changes: tuple[TensorChange, ...] = ()
    groups: tuple[TensorGroup, ...] = ()
    config_keys: tuple[ConfigChange, ...] = ()
    config_notes: tuple[str, ...] = ()
    relation: str | None = None
    same_model: bool = False

    @property
    def same(self) -> bool:
        """One identity, or (``same_model``) one model whose identities differ only by manifest format."""
        return self.identity_a == self.identity_b or self.same_model


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
    identity while an engine loads other tensors. ``hasher`` replaces
    ``hashing.hash_spans`` (a ``distributed.DistributedHasher`` spreads the work over a job's ranks).
    """
    if expect_identity is not None:
        check_identity(expect_identity, "expected identity")
    if threads is not None and (type(threads) is not int or threads < 1):
        raise CkptpubError(f"threads: expected a positive int or None, got {threads!r}")
    root = resolve_folder(folder)
    manifest = read_manifest(root)
    entries = {e.path: e for e in scan_folder(root)}
    problems: list[Problem] = []
    checks = _Checks()
    layouts: dict[str, ShardLayout] = {}
    by_file: dict[str, list[TensorRecord]] = {}
    for tensor in manifest.tensors:
        by_file.setdefault(tensor.file, []).append(tensor)
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
            checks.add_shard(record, by_file.get(record.path, []), entry)
            try:
                layouts[record.path] = read_layout(entry.real_path, record.path, entry.file_id)
            except CkptpubError as error:
                problems.append(Problem(record.path, "header", str(error).removeprefix(f"{record.path}: ")))
    for path in entries.keys() - {f.path for f in manifest.files}:
        problems.append(Problem(path, "added", "in the folder but not in the manifest"))
    digests = (hasher or hash_spans)(
        checks.spans, threads=threads, use_mmap=use_mmap, on_progress=on_progress
    )
    problems.extend(checks.mismatches(digests))
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
    return VerifyReport(manifest, tuple(f.path for f in manifest.files), tuple(problems))


def diff_manifests(
    a: Manifest,
    b: Manifest,
    *,
    folder_a: str | os.PathLike[str] | None = None,
    folder_b: str | os.PathLike[str] | None = None,
) -> ManifestDiff:
    """Compare the model tensors and configs of two manifests; no tensor data is read.

    With ``folder_a`` and ``folder_b`` (the checkpoint folders the manifests came
    from), config files whose digests differ are read there, if they still have
    those digests, to name the keys that changed.
    """
    for name, value in (("a", a), ("b", b)):
        if not isinstance(value, Manifest):
            raise CkptpubError(
                f"diff_manifests: {name} must be a Manifest (see read_manifest), got {type(value).__name__}"
            )
    tensors_a, tensors_b = _model_tensors(a), _model_tensors(b)
    changed = sorted(n for n in tensors_a.keys() & tensors_b.keys() if tensors_a[n] != tensors_b[n])
    added = sorted(tensors_b.keys() - tensors_a.keys())
    removed = sorted(tensors_a.keys() - tensors_b.keys())
    configs = compare_configs(
        a, b, *(None if f is None else as_path(f, "folder") for f in (folder_a, folder_b))
    )
    changes = tuple(tensor_change(n, tensors_a[n], tensors_b[n]) for n in changed)
    groups = (
        group_tensors("changed", [(c.name, c.what) for c in changes])
        + group_tensors("added", [(n, tensors_b[n].dtype) for n in added])
        + group_tensors("removed", [(n, tensors_a[n].dtype) for n in removed])
    )
    return ManifestDiff(
        identity_a=a.identity,
        identity_b=b.identity,
        changed=tuple(changed),
        added=tuple(added),
        removed=tuple(removed),
        config_changed=configs.changed,
        tensor_changes=changes,
        groups=groups,
        config_keys=configs.keys,
        config_notes=configs.notes,
        relation=relation(a, b),
        # Manifests of one model in two formats have different identities (the format is in the preimage,
        # and /3 leaves inert config keys out): with every weight tensor the same and the configs' meaning
        # the same under the newer format's rule, they name the same model.
        same_model=a.version != b.version
        and bool(a.weights and b.weights)
        and not (changed or added or removed or configs.changed),
    )


class _Checks:
    """What ``verify`` hashes, and what each digest must be; a ``Problem`` is made only for a mismatch.

    A 100k-tensor checkpoint has 100k checks: each holds its span and the manifest's
    own record (no copy of names or digests), so memory stays near the manifest's.
    """

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._expected: list[str] = []
        self._subjects: list[Problem | TensorRecord] = []  # a TensorRecord: "tensor bytes differ"

    def add(self, span: Span, digest: str, problem: Problem) -> None:
        self.spans.append(span)
        self._expected.append(digest)
        self._subjects.append(problem)

    def add_shard(self, record: FileRecord, tensors: list[TensorRecord], entry: FolderEntry) -> None:
        """The shard's header, then each tensor where the manifest places it.

        ``verify`` parses the header too, so a manifest that places tensors where the
        header does not is caught even when every hashed range matches.
        """
        path, header_size = record.path, record.header_size or 0
        self.add(
            Span(entry.real_path, 0, header_size, path, entry.file_id),
            record.digest,
            Problem(path, "header", "safetensors header differs"),
        )
        for tensor in tensors:
            begin, end = tensor.data_offsets
            self.spans.append(
                Span(
                    entry.real_path, header_size + begin, header_size + end, path, entry.file_id, tensor.name
                )
            )
            self._expected.append(tensor.digest)
            self._subjects.append(tensor)

    def mismatches(self, digests: list[str]) -> Iterator[Problem]:
        for got, want, subject in zip(digests, self._expected, self._subjects, strict=True):
            if got != want:
                yield subject if isinstance(subject, Problem) else _tensor_differs(subject)


def _tensor_differs(tensor: TensorRecord) -> Problem:
    return Problem(tensor.file, "tensor", "bytes differ", tensor.name)


def _claims(
    manifest: Manifest, entries: dict[str, FolderEntry], layouts: dict[str, ShardLayout]
) -> list[Problem]:
    """With every byte matching, the manifest's shards, weights and config must be the folder's own.

    Shards the manifest lists as plain files are parsed here too: the rule needs
    the layout of every file ``publish`` would parse.
    """
    problems = []
    for path, entry in entries.items():
        if is_shard_path(path) and path not in layouts:
            try:
                layouts[path] = read_layout(entry.real_path, path, entry.file_id)
            except CkptpubError as error:
                problems.append(
                    Problem(path, "manifest", f"not a valid safetensors file, which publish refuses: {error}")
                )
    problems.extend(
        Problem(path, "manifest", detail) for path, detail in claim_problems(manifest, entries, layouts)
    )
    return problems


def _model_tensors(manifest: Manifest) -> dict[str, ModelEntry]:
    """Model tensors by name; for a folder without weight files, every tensor by ``file:name``."""
    if manifest.weights:
        return manifest.model()
    return {f"{t.file}:{t.name}": ModelEntry(t.dtype, t.shape, t.digest) for t in manifest.tensors}
