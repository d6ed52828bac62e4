"""What a difference between two manifests means: per-tensor changes, groups, config keys, lineage.

``diff.diff_manifests`` says *which* tensors differ; a user asks *why* (a dtype
cast, a shape change, training), *where* ("q/v_proj in layers 0-27", not 56 lines),
*which config keys* moved, and *how the two relate* (an adapter on that base, a
model trained from it). This module answers those from the manifests alone, plus
the two folders' ``config.json`` when they are at hand: a manifest records only
a config's digest, so keys can be named only from the files, and only when the
files still have the digest the manifest recorded.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from .._filesystem.hub_cache import BASE_HUB_KEY
from .._filesystem.model_files import MAX_CONFIG_BYTES
from .._filesystem.safe_open import read_inside
from .._format.canonical import canonical_json
from .._format.config_meaning import WRITTEN_BY, meaning
from .._format.manifest import Manifest, ModelEntry, config_meaning
from .._format.names import CONFIG_FILES, MANIFEST_NAME
from ..errors import CkptpubError

#: A pattern lists at most this many alternatives at one position (``{a,b,... 40 more}`` beyond).
_MAX_WORDS_SHOWN = 8
#: Files whose tensors are an adapter's (PEFT's ``save_pretrained`` names).
_ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


class TensorChange(NamedTuple):
    """One tensor both sides have, with different meaning: what differs (dtype, shape, or only bytes)."""

    name: str
    dtype_a: str
    dtype_b: str
    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]

    @property
    def what(self) -> str:
        """``dtype BF16 -> F32``, ``shape [4, 8] -> [4, 16]``, both, or ``bytes`` (same dtype and shape)."""
        parts = []
        if self.dtype_a != self.dtype_b:
            parts.append(f"dtype {self.dtype_a} -> {self.dtype_b}")
        if self.shape_a != self.shape_b:
            parts.append(f"shape {list(self.shape_a)} -> {list(self.shape_b)}")
        return ", ".join(parts) or "bytes"


class TensorGroup(NamedTuple):
    """Tensors of one kind (``changed``/``added``/``removed``) and one ``what``, named by one pattern.

    ``pattern`` has ``*`` where a numbered module's index goes and ``{q,v}`` where
    names differ in one part; ``over`` is the numbered part's name (``layers``) and
    ``indices`` the numbers it takes (empty when the names have no number).
    """

    kind: str
    what: str
    pattern: str
    over: str
    indices: tuple[int, ...]
    names: tuple[str, ...]

    @property
    def where(self) -> str:
        """``in layers 0-27`` (empty when the pattern has no number)."""
        return f"in {self.over} {_ranges(self.indices)}" if self.indices else ""


class ConfigChange(NamedTuple):
    """One top-level key of a config file whose value differs.

    ``old`` or ``new`` is None where the key is absent on that side.
    ``changes_identity`` is False for a key whose change the identity does not see
    (``config_meaning``: ``use_cache`` and the like).
    """

    file: str
    key: str
    old: object
    new: object
    in_a: bool = True
    in_b: bool = True
    changes_identity: bool = True


def tensor_change(name: str, a: ModelEntry, b: ModelEntry) -> TensorChange:
    return TensorChange(name, a.dtype, b.dtype, tuple(a.shape), tuple(b.shape))


def group_tensors(kind: str, items: list[tuple[str, str]]) -> tuple[TensorGroup, ...]:
    """Group ``(name, what)`` pairs: numbered modules collapse to ``*``, then sibling names to ``{a,b}``.

    Names are split at dots. The first numbered part (``layers.3``) becomes ``*``
    and its numbers the group's indices. Then groups with the same ``what``, the
    same indices and names that differ in one part only are merged, repeatedly
    (``q_proj.lora_A`` .. ``v_proj.lora_B`` end as ``{q,v}_proj.lora_{A,B}``), as
    long as the differing words are one family (``*_proj``, ``lora_*``): attention
    projections and norms stay apart.
    """
    by_key: dict[tuple[str, tuple[str, ...], int], dict[int | None, str]] = {}
    for name, what in items:
        parts = name.split(".")
        star = next((i for i, p in enumerate(parts) if p.isascii() and p.isdigit() and i > 0), -1)
        key_parts = tuple("*" if i == star else p for i, p in enumerate(parts))
        by_key.setdefault((what, key_parts, star), {})[int(parts[star]) if star >= 0 else None] = name
    groups = [
        _Draft(
            what,
            tuple(frozenset((p,)) for p in parts),
            star,
            tuple(sorted(i for i in members if i is not None)),
            tuple(members.values()),
        )
        for (what, parts, star), members in by_key.items()
    ]
    while True:
        merged = _merge_once(groups)
        if merged is None:
            break
        groups = merged
    result = [
        TensorGroup(kind, g.what, g.names[0], "", (), g.names)
        if len(g.names) == 1
        else TensorGroup(
            kind,
            g.what,
            ".".join(_render(words) for words in g.words),
            next(iter(g.words[g.star - 1])) if g.star > 0 else "",
            g.indices,
            tuple(sorted(g.names)),
        )
        for g in groups
    ]
    return tuple(sorted(result, key=lambda g: (min(g.names), g.what)))


class _Draft(NamedTuple):
    """A group being built: the set of words at each dotted position (``*`` at ``star``)."""

    what: str
    words: tuple[frozenset[str], ...]
    star: int
    indices: tuple[int, ...]
    names: tuple[str, ...]


def _merge_once(groups: list[_Draft]) -> list[_Draft] | None:
    """One sweep over positions (last first): merge groups that differ only there; None when none did.

    Each group falls in one bucket per position and family, so a sweep merges
    every bucket it finds at once: a few sweeps group thousands of names.
    """
    changed = False
    for column in range(max((len(g.words) for g in groups), default=0) - 1, -1, -1):
        for family in (_suffix_family, _prefix_family):
            buckets: dict[tuple[object, ...], list[_Draft]] = {}
            kept = []
            for g in groups:
                kin = family(g.words[column]) if column < len(g.words) and column != g.star else None
                if kin is None:
                    kept.append(g)
                else:
                    buckets.setdefault(
                        (g.what, g.star, g.indices, g.words[:column], g.words[column + 1 :], kin), []
                    ).append(g)
            for members in buckets.values():
                if len(members) == 1:
                    kept.append(members[0])
                    continue
                changed = True
                first = members[0]
                words = frozenset().union(*(m.words[column] for m in members))
                kept.append(
                    first._replace(
                        words=first.words[:column] + (words,) + first.words[column + 1 :],
                        names=tuple(n for m in members for n in m.names),
                    )
                )
            groups = kept
    return groups if changed else None


def _suffix_family(words: frozenset[str]) -> str | None:
    """``proj`` for ``{q_proj, k_proj}``; ``""`` for words without ``_``; None when they disagree."""
    families = {w.rsplit("_", 1)[1] if "_" in w else "" for w in words}
    return "s:" + families.pop() if len(families) == 1 else None


def _prefix_family(words: frozenset[str]) -> str | None:
    """``lora`` for ``{lora_A, lora_B}``; None for words without ``_`` or that disagree."""
    families = {w.split("_", 1)[0] if "_" in w else None for w in words}
    family = families.pop() if len(families) == 1 else None
    return None if family is None else "p:" + family


def _render(words: frozenset[str]) -> str:
    """``q_proj``, or ``{q,v}_proj`` for several words sharing a prefix and suffix."""
    ordered = sorted(words)
    if len(ordered) == 1:
        return ordered[0]
    prefix = os.path.commonprefix(ordered)
    suffix = os.path.commonprefix([w[len(prefix) :][::-1] for w in ordered])[::-1]
    middles = [w[len(prefix) : len(w) - len(suffix)] for w in ordered]
    if not all(middles):  # "q" and "q_a": keep the words whole
        prefix, suffix, middles = "", "", ordered
    if all(m.isascii() and m.isdigit() and str(int(m)) == m for m in middles):  # a second numbered part
        return f"{prefix}{{{_ranges(tuple(sorted(map(int, middles))))}}}{suffix}"
    if len(middles) > _MAX_WORDS_SHOWN:  # the names are in the group; the line stays a line
        shown = ",".join(middles[:3])
        return f"{prefix}{{{shown},... {len(middles) - 3} more}}{suffix}"
    return f"{prefix}{{{','.join(middles)}}}{suffix}"


def _ranges(indices: tuple[int, ...]) -> str:
    """``0-3,5,7-9``."""
    spans: list[list[int]] = []
    for i in indices:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


def is_adapter(manifest: Manifest) -> bool:
    """An adapter checkpoint: PEFT's adapter weights or adapter config, not a full model."""
    return "adapter_config.json" in manifest.config or any(w in _ADAPTER_WEIGHTS for w in manifest.weights)


def base_of(manifest: Manifest) -> str | None:
    """The recorded base identity (``provenance.base_identity``), if it is a string."""
    base = manifest.provenance.get("base_identity")
    return base if isinstance(base, str) else None


def hub_name(record: object) -> str | None:
    """``org/name@<commit>`` of a hub record (``provenance.hub``: the model itself in the Hugging Face
    cache; ``base_hub``: its base), or None for anything else."""
    if not isinstance(record, dict):
        return None
    repo_id, revision = record.get("repo_id"), record.get("revision")
    if not isinstance(repo_id, str) or not isinstance(revision, str):
        return None
    return f"{repo_id}@{revision}"


def storage_name(record: object) -> str | None:
    """``s3://bucket/prefix (N objects)`` of a storage record (``provenance.storage``, written by a
    publish in object storage), or None for anything else; ``--json`` shows each object's ETag and version."""
    if not isinstance(record, dict):
        return None
    url, objects = record.get("url"), record.get("objects")
    if not isinstance(url, str) or not isinstance(objects, dict):
        return None
    return f"{url} ({len(objects)} objects; their ETags and versions: --json)"


def base_hub_of(manifest: Manifest) -> str | None:
    """The recorded base by hub id and commit (``provenance.base_hub``), if there is one."""
    return hub_name(manifest.provenance.get(BASE_HUB_KEY))


def relation(a: Manifest, b: Manifest) -> str | None:
    """How ``b`` relates to ``a`` by recorded lineage.

    ``adapter_on_a``/``adapter_on_b``: one is an adapter whose base is the other;
    ``from_a``/``from_b``: one records the other as its base (a fine-tune, a merge);
    ``same_base``: both record the same base; None: nothing recorded links them.
    """
    if base_of(b) == a.identity:
        return "adapter_on_a" if is_adapter(b) else "from_a"
    if base_of(a) == b.identity:
        return "adapter_on_b" if is_adapter(a) else "from_b"
    if base_of(a) is not None and base_of(a) == base_of(b):
        return "same_base"
    return None


class ConfigComparison(NamedTuple):
    """How two manifests' configs compare: which files differ in meaning, key by key where readable.

    ``changed`` names the config files whose meaning differs (their recorded digests
    differ, ``config_meaning``). ``keys`` lists each top-level key whose value
    differs, meaningful or not (``ConfigChange.changes_identity``); ``notes`` says what
    could not be compared and why.
    """

    changed: tuple[str, ...]
    keys: tuple[ConfigChange, ...]
    notes: tuple[str, ...]


def compare_configs(a: Manifest, b: Manifest, folder_a: str | None, folder_b: str | None) -> ConfigComparison:
    """Compare the configs of ``a`` and ``b``, reading their files from the folders when they are given.

    A config is read from its folder only if the file is a regular file inside it (a
    symlink only to a file inside it, as publishing allows) and still has the digest
    the manifest recorded: keys read from a file edited since publishing would
    describe a different model. A config whose file bytes are the same on both sides
    is not read.
    """
    changed: list[str] = []
    keys: list[ConfigChange] = []
    notes: list[str] = []
    for name in CONFIG_FILES:
        digest_a, digest_b = a.config.get(name), b.config.get(name)
        if digest_a is None or digest_b is None:
            if digest_a != digest_b:
                changed.append(name)
                notes.append(f"{name} only in {'b' if digest_a is None else 'a'}")
            continue
        if digest_a != digest_b:
            changed.append(name)
        elif _file_digest(a, name) == _file_digest(b, name):
            continue  # the same bytes
        documents = []
        for side, manifest, folder in (("a", a, folder_a), ("b", b, folder_b)):
            document, why = _read_config(folder, name, manifest.config[name])
            if document is None:
                if digest_a != digest_b:
                    notes.append(f"{name} differs; keys not compared: {side}: {why}")
                break
            documents.append(document)
        if len(documents) == 2:
            keys.extend(_key_changes(name, documents[0], documents[1]))
    return ConfigComparison(tuple(changed), tuple(keys), tuple(notes))


def _file_digest(manifest: Manifest, path: str) -> str | None:
    return next((f.digest for f in manifest.files if f.path == path), None)


def _read_config(
    folder: str | None, name: str, digest: str
) -> tuple[dict[str, Any], None] | tuple[None, str]:
    if folder is None:
        return None, "given as a manifest file, not a folder"
    try:  # a symlink inside the folder is followed, as publishing followed it
        document, meaning_digest = config_meaning(read_inside(folder, name, MAX_CONFIG_BYTES), name)
    except CkptpubError as error:
        return None, str(error)
    if meaning_digest != digest:
        return None, f"{name} changed since {MANIFEST_NAME} was written"
    return document, None


def _meaning_text(document: dict[str, Any]) -> bytes:
    """What a config digest is taken of (as bytes: ``1`` and ``1.0`` are one value)."""
    return canonical_json(meaning(document))


def _key_changes(name: str, old: dict[str, Any], new: dict[str, Any]) -> list[ConfigChange]:
    """Each top-level key whose value differs; ``changes_identity``: whether the identity counts it."""
    changes = []
    for key in sorted((old.keys() | new.keys()) - WRITTEN_BY):
        before = {key: old[key]} if key in old else {}
        after = {key: new[key]} if key in new else {}
        if canonical_json(before) == canonical_json(after):
            continue
        counts = _meaning_text(before) != _meaning_text(after)
        changes.append(ConfigChange(name, key, old.get(key), new.get(key), key in old, key in new, counts))
    return changes
