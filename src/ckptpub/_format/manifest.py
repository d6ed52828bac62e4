"""The manifest: plain data with explicit parsing, validation, canonical encoding and identity.

A manifest (``ckptpub.json``, specified in ``docs/format.md``) lists a digest for
every tensor and every file of a checkpoint folder, which files hold the model's
weights, the canonical digest of the model's config, and an ``identity`` derived
from the weights and config alone. Parsing validates every field and recomputes
the identity, so a manifest that was edited, truncated or copied from another
checkpoint is refused instead of being trusted.

Writers write ``ckptpub/2``: a one-line JSON header followed by two text tables
(``tables``), which is read and identity-checked in milliseconds at 100k tensors.
Its tensor records are decoded, and the tables checked line by line, on first use
of ``Manifest.tensors``; the identity commits to the tables' bytes, so a reader
that needs only the identity (an engine's cache key) does no per-tensor work.
Readers still read ``ckptpub/1`` (one JSON document), fully validated at once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any, TypeGuard

from ..errors import CkptpubError
from .canonical import canonical_json
from .digest import DIGEST_PREFIX, digest_bytes
from .safetensors import DTYPE_BITS
from .strict_json import loads_strict
from .tables import (
    FileRecord,
    ModelEntry,
    Tables,
    TensorRecord,
    check_name,
    decode_model,
    decode_tables,
    encode_tables,
    line,
    model_table,
)

FORMAT = "ckptpub/2"
#: The first format, still read (and written by ``Manifest.to_json(FORMAT_V1)``).
FORMAT_V1 = "ckptpub/1"
MANIFEST_NAME = "ckptpub.json"
#: A manifest larger than this is refused unread (about 250k tensors fit).
MAX_MANIFEST_BYTES = 64 << 20
#: Config files whose meaning (not formatting) is part of the identity.
CONFIG_FILES = ("config.json", "adapter_config.json")
_DIGEST = re.compile(re.escape(DIGEST_PREFIX) + "[0-9a-f]{64}")

__all__ = [
    "FileRecord",
    "Manifest",
    "ModelEntry",
    "TensorRecord",
    "compute_identity",
    "config_digest",
    "parse_manifest",
]


def is_digest(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a ckptpub digest: ``blake3:`` and 64 lowercase hex digits."""
    return isinstance(value, str) and _DIGEST.fullmatch(value) is not None


def check_identity(value: object, what: str) -> str:
    """``value`` when it is an identity (``blake3:`` and 64 lowercase hex digits), else ``CkptpubError``.

    The one check for identities a person gives (``--expect-identity``, a serving
    pin, ``publish(base=...)``): ``what`` names where the value came from.
    """
    if not is_digest(value):
        raise CkptpubError(f"{what}: {value!r} is not of the form blake3:<64 lowercase hex digits>")
    return value


class Manifest:
    """A parsed, validated manifest. Build one with ``publish``/``build_manifest`` or ``parse_manifest``.

    ``tensors`` is decoded from a ``ckptpub/2`` manifest's tables on first use
    (raising ``CkptpubError`` if a table breaks a rule); ``identity``, ``files``,
    ``weights``, ``config`` and ``provenance`` are checked when the manifest is parsed.
    """

    __slots__ = (
        "identity",
        "files",
        "weights",
        "config",
        "provenance",
        "version",
        "_tensors",
        "_tables",
        "_name",
    )

    def __init__(
        self,
        identity: str,
        tensors: tuple[TensorRecord, ...],
        files: tuple[FileRecord, ...],
        weights: tuple[str, ...],
        config: Mapping[str, str],
        provenance: Mapping[str, object],
        version: str = FORMAT,
    ) -> None:
        #: The format whose identity ``identity`` is (a manifest read from a ckptpub/1 file keeps its own).
        self.version = version
        self.identity = identity
        self.files = files
        self.weights = weights
        self.config = config
        self.provenance = provenance
        self._tensors: tuple[TensorRecord, ...] | None = tensors
        self._tables: Tables | None = None
        self._name = MANIFEST_NAME

    @classmethod
    def from_tables(
        cls,
        identity: str,
        tables: Tables,
        files: tuple[FileRecord, ...],
        weights: tuple[str, ...],
        config: Mapping[str, str],
        provenance: Mapping[str, object],
        display_name: str = MANIFEST_NAME,
    ) -> Manifest:
        """A manifest whose tensor records are decoded from ``tables`` when first asked for."""
        manifest = cls(identity, (), files, weights, config, provenance)
        manifest._tensors, manifest._tables, manifest._name = None, tables, display_name
        return manifest

    def _replace(self, **changes: Any) -> Manifest:
        """A copy with some fields changed (``Manifest`` was a ``NamedTuple``; its callers keep this)."""
        fields = {
            name: getattr(self, name) for name in ("identity", "files", "weights", "config", "provenance")
        }
        if "tensors" in changes or self._tables is None:
            fields["tensors"] = changes.pop("tensors") if "tensors" in changes else self.tensors
            return Manifest(**(fields | changes), version=self.version)
        copy = Manifest.from_tables(tables=self._tables, display_name=self._name, **(fields | changes))
        copy.version = self.version
        return copy

    def __eq__(self, other: object) -> bool:
        """Equal manifests list the same entries (their tables' bytes) and the same header fields."""
        if not isinstance(other, Manifest):
            return NotImplemented
        fields = ("version", "identity", "files", "weights", "config", "provenance")
        return all(getattr(self, f) == getattr(other, f) for f in fields) and self.tables == other.tables

    __hash__ = None  # type: ignore[assignment]  # mutable caches inside; as a NamedTuple of dicts it had none

    def __repr__(self) -> str:
        return f"Manifest(identity={self.identity!r}, {self.tensor_count} tensors, {len(self.files)} files)"

    @property
    def tensors(self) -> tuple[TensorRecord, ...]:
        """Every tensor, in file then offset order."""
        if self._tensors is None:
            assert self._tables is not None
            self._tensors = decode_tables(self._tables, self.files, self.weights, self._name)
        return self._tensors

    @property
    def tables(self) -> Tables:
        """The ``ckptpub/2`` tables (the model table's bytes are what the identity covers)."""
        if self._tables is None:
            self._tables = _tables_of(self.tensors, self.files, self.weights)
        return self._tables

    @property
    def tensor_count(self) -> int:
        """How many tensors the manifest lists (without decoding them)."""
        if self._tensors is not None:
            return len(self._tensors)
        return self.tables.layout.count(b"\n")

    @property
    def model_tensor_count(self) -> int:
        """How many tensors the weight files hold (without decoding them)."""
        if self._tensors is not None:
            return len(self.weight_tensors())
        return self.tables.model.count(b"\n")

    def model(self) -> dict[str, ModelEntry]:
        """The model's tensors by name, as the identity covers them (dtype, shape, digest; no place).

        For a ``ckptpub/2`` manifest this reads the model table alone, far faster
        than ``weight_tensors`` at 100k tensors.
        """
        if self._tensors is None and self._tables is not None:
            return decode_model(self._tables.model, self._name)
        return {t.name: ModelEntry(t.dtype, t.shape, t.digest) for t in self.weight_tensors().values()}

    def weight_tensors(self) -> dict[str, TensorRecord]:
        """The model's tensors (those in ``weights`` files) by name."""
        weight_files = set(self.weights)
        return {t.name: t for t in self.tensors if t.file in weight_files}

    def to_json(self, version: str = FORMAT) -> bytes:
        """The encoding written to ``ckptpub.json``: ``ckptpub/2``, or ``ckptpub/1`` when asked.

        The identity written is the one ``version`` defines (the two formats' differ).
        """
        if version == FORMAT_V1:
            return canonical_json(self._v1_document()) + b"\n"
        if version != FORMAT:
            raise ValueError(f"no encoding for manifest format {version!r}")
        tables = self.tables
        header = {
            "format": FORMAT,
            "identity": identity_of_tables(tables, self.files, self.weights, self.config),
            "config": dict(self.config),
            "weights": list(self.weights),
            "files": _files_json(self.files, tables.counts),
            "tables": {"model": len(tables.model), "layout": len(tables.layout)},
            "provenance": dict(self.provenance),
        }
        return b"".join((canonical_json(header), b"\n", tables.model, tables.layout))

    def _v1_document(self) -> dict[str, Any]:
        return {
            "format": FORMAT_V1,
            "identity": compute_identity(self.tensors, self.files, self.weights, self.config, FORMAT_V1),
            "config": dict(self.config),
            "weights": list(self.weights),
            "tensors": [
                {
                    "name": t.name,
                    "dtype": t.dtype,
                    "shape": list(t.shape),
                    "file": t.file,
                    "data_offsets": list(t.data_offsets),
                    "digest": t.digest,
                }
                for t in self.tensors
            ],
            "files": [
                {"path": f.path, "size": f.size, "digest": f.digest}
                | ({} if f.header_size is None else {"header_size": f.header_size})
                for f in self.files
            ],
            "provenance": dict(self.provenance),
        }


def _tables_of(
    tensors: Sequence[TensorRecord], files: Sequence[FileRecord], weights: Sequence[str]
) -> Tables:
    per_file: dict[str, list[tuple[str, str]]] = {}
    for t in tensors:
        check_name(t.name, t.file)
        per_file.setdefault(t.file, []).append((t.name, line(t.name, t.dtype, t.shape, t.digest)))
    return encode_tables(files, weights, per_file)


def _files_json(files: Sequence[FileRecord], counts: Sequence[int]) -> list[dict[str, Any]]:
    """``files`` as the ``ckptpub/2`` header lists them: a shard with its ``header_size`` and tensor count."""
    shard_counts = iter(counts)
    return [
        {"path": f.path, "size": f.size, "digest": f.digest}
        | ({} if f.header_size is None else {"header_size": f.header_size, "tensors": next(shard_counts)})
        for f in files
    ]


def compute_identity(
    tensors: tuple[TensorRecord, ...],
    files: tuple[FileRecord, ...],
    weights: tuple[str, ...],
    config: Mapping[str, str],
    version: str = FORMAT,
) -> str:
    """The model's identity: a digest of its weights' names, dtypes, shapes and bytes, and its config.

    Nothing about where the bytes lie (folder, shard names, shard layout, header
    metadata) enters it. A folder with no weight files (an FSDP or DeepSpeed
    layout) falls back to every file's path and digest, so any byte change still
    changes the identity. ``version`` picks the format's preimage (they differ).
    """
    if version == FORMAT and weights:
        weight_files = set(weights)
        model = model_table(
            [(t.name, line(t.name, t.dtype, t.shape, t.digest)) for t in tensors if t.file in weight_files]
        )
        return identity_of_tables(Tables(model, b"", ()), files, weights, config)
    if version == FORMAT:
        return identity_of_tables(_tables_of(tensors, files, weights), files, weights, config)
    document: dict[str, Any] = {"format": FORMAT_V1, "config": dict(config)}
    if weights:
        weight_files = set(weights)
        document["tensors"] = sorted(
            [t.name, t.dtype, list(t.shape), t.digest] for t in tensors if t.file in weight_files
        )
    else:
        document["files"] = [[f.path, f.size, f.digest] for f in files]
        document["tensors"] = [[t.file, t.name, t.dtype, list(t.shape), t.digest] for t in tensors]
    return digest_bytes(canonical_json(document))


def identity_of_tables(
    tables: Tables, files: Sequence[FileRecord], weights: Sequence[str], config: Mapping[str, str]
) -> str:
    """The ``ckptpub/2`` identity: one BLAKE3 pass over the model table, then a small canonical document."""
    document: dict[str, Any] = {"format": FORMAT, "config": dict(config), "model": digest_bytes(tables.model)}
    if not weights:
        document["files"] = _files_json(files, tables.counts)
        document["layout"] = digest_bytes(tables.layout)
    return digest_bytes(canonical_json(document))


def config_digest(document: Mapping[str, Any]) -> str:
    """Digest of a config's meaning: canonical JSON less the keys that say where or by what it was written."""
    meaningful = {k: v for k, v in document.items() if k not in _VOLATILE_CONFIG_KEYS}
    return digest_bytes(canonical_json(meaningful))


_VOLATILE_CONFIG_KEYS = frozenset({"_name_or_path", "transformers_version", "_commit_hash"})


def parse_manifest(data: bytes, display_name: str = MANIFEST_NAME) -> Manifest:
    """Parse and validate manifest bytes (``ckptpub/2`` or ``/1``); ``CkptpubError`` names the first problem.

    A ``ckptpub/2`` manifest's header, sizes and identity are checked here; its
    tables line by line when ``Manifest.tensors`` is first used.
    """
    if len(data) > MAX_MANIFEST_BYTES:
        raise CkptpubError(
            f"{display_name}: {len(data)} bytes is over the {MAX_MANIFEST_BYTES}-byte manifest limit"
        )
    validator = _Validator(display_name)
    newline = data.find(b"\n")
    # A view: the tables are copied once, each into its own bytes, not first as one remainder.
    head, rest = (data, memoryview(b"")) if newline < 0 else (data[:newline], memoryview(data)[newline + 1 :])
    try:
        document = loads_strict(head, display_name, "manifest")
    except CkptpubError:  # a ckptpub/1 document over several lines, or no JSON at all
        return validator.manifest_v1(loads_strict(data, display_name, "manifest"))
    if isinstance(document, dict) and document.get("format") == FORMAT:
        return validator.manifest_v2(document, rest)
    if bytes(rest).strip():
        document = loads_strict(data, display_name, "manifest")
    return validator.manifest_v1(document)


class _Validator:
    """Checks one decoded manifest document; each error names the field at fault."""

    def __init__(self, display_name: str) -> None:
        self.name = display_name

    def fail(self, message: str) -> CkptpubError:
        return CkptpubError(f"{self.name}: {message}")

    def fields_of(self, document: Any, expected: set[str]) -> dict[str, Any]:
        if not isinstance(document, dict):
            raise self.fail("manifest is not a JSON object")
        version = document.get("format")
        if version not in (FORMAT, FORMAT_V1):
            raise self.fail(
                f"unsupported manifest format {version!r} (this ckptpub reads {FORMAT!r} and {FORMAT_V1!r})"
            )
        if set(document) != expected:
            extra, missing = set(document) - expected, expected - set(document)
            raise self.fail(f"manifest fields {sorted(extra)} unexpected, {sorted(missing)} missing")
        if not isinstance(document["provenance"], dict):
            raise self.fail("provenance is not an object")
        if not is_digest(document["identity"]):
            raise self.fail(f"identity {document['identity']!r} is not a blake3 digest")
        return document

    def mismatch(self) -> CkptpubError:
        return self.fail(
            "recorded identity does not match the manifest's own entries (edited or corrupt manifest)"
        )

    def manifest_v2(self, document: Any, rest: memoryview) -> Manifest:
        """The header is checked field by field; the tables by size, line counts and the identity."""
        expected = {"format", "identity", "config", "weights", "tables", "files", "provenance"}
        document = self.fields_of(document, expected)
        counts: list[int] = []
        files = []
        for index, entry in enumerate(self.array(document["files"], "files")):
            record = self.file(entry, index, _SHARD_EXTRA if _is_shard_entry(entry) else frozenset())
            if record.header_size is not None:
                counts.append(self.count(entry["tensors"], f"{record.path}: tensors"))
            files.append(record)
        paths = [f.path for f in files]
        if any(a >= b for a, b in pairwise(paths)):
            raise self.fail("files are not sorted by path, or a file is listed twice")
        weights = tuple(self.path(p, "weights") for p in self.array(document["weights"], "weights"))
        shard_counts = dict(zip((f.path for f in files if f.header_size is not None), counts, strict=True))
        if any(a >= b for a, b in pairwise(weights)) or not set(weights) <= shard_counts.keys():
            raise self.fail("weights: not sorted listed safetensors files, each once")
        sizes = self.fields(document["tables"], {"model", "layout"}, set(), "tables")
        model_size = self.count(sizes["model"], "tables: model")
        layout_size = self.count(sizes["layout"], "tables: layout")
        if model_size + layout_size != len(rest):
            raise self.fail(f"tables hold {len(rest)} bytes, the header says {model_size + layout_size}")
        tables = Tables(bytes(rest[:model_size]), bytes(rest[model_size:]), tuple(counts))
        weight_count = sum(shard_counts[w] for w in weights)
        if tables.model.count(b"\n") != weight_count or tables.layout.count(b"\n") != sum(counts):
            raise self.fail("tables: line counts do not match the files' tensor counts")
        config = self.config(document["config"])
        if document["identity"] != identity_of_tables(tables, files, weights, config):
            raise self.mismatch()
        return Manifest.from_tables(
            document["identity"], tables, tuple(files), weights, config, document["provenance"], self.name
        )

    def manifest_v1(self, document: Any) -> Manifest:
        expected = {"format", "identity", "config", "weights", "tensors", "files", "provenance"}
        document = self.fields_of(document, expected)
        if document["format"] != FORMAT_V1:
            raise self.fail(f"a {FORMAT!r} manifest must have its tables after a one-line header")
        files = tuple(self.file(entry, i) for i, entry in enumerate(self.array(document["files"], "files")))
        tensors = tuple(
            self.tensor(entry, i) for i, entry in enumerate(self.array(document["tensors"], "tensors"))
        )
        weights = tuple(self.path(p, "weights") for p in self.array(document["weights"], "weights"))
        config = self.config(document["config"])
        self.cross_check(files, tensors, weights)
        identity = document["identity"]
        if identity != compute_identity(tensors, files, weights, config, FORMAT_V1):
            raise self.mismatch()
        return Manifest(identity, tensors, files, weights, config, document["provenance"], FORMAT_V1)

    def array(self, value: Any, what: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(f"{what} is not an array")
        return value

    def digest(self, value: Any, where: str) -> str:
        if not is_digest(value):
            raise self.fail(f"{where}: {value!r} is not a blake3 digest")
        return value

    def count(self, value: Any, where: str) -> int:
        if type(value) is not int or not 0 <= value < 2**63:
            raise self.fail(f"{where}: {value!r} is not a non-negative integer")
        return value

    def path(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not is_safe_relative_path(value):
            raise self.fail(f"{where}: {value!r} is not a safe relative path inside the folder")
        return value

    def fields(self, entry: Any, required: set[str], optional: set[str], where: str) -> dict[str, Any]:
        if not isinstance(entry, dict) or not required <= set(entry) <= required | optional:
            raise self.fail(f"{where} must be an object with fields {sorted(required)}")
        return entry

    def file(self, entry: Any, index: int, also: frozenset[str] = frozenset()) -> FileRecord:
        where = f"files[{index}]"
        entry = self.fields(entry, {"path", "size", "digest"} | also, {"header_size"}, where)
        path = self.path(entry["path"], where)
        header_size = entry.get("header_size")
        if header_size is not None:
            header_size = self.count(header_size, f"{path}: header_size")
        return FileRecord(
            path=path,
            size=self.count(entry["size"], f"{path}: size"),
            digest=self.digest(entry["digest"], f"{path}: digest"),
            header_size=header_size,
        )

    def tensor(self, entry: Any, index: int) -> TensorRecord:
        where = f"tensors[{index}]"
        entry = self.fields(entry, {"name", "dtype", "shape", "file", "data_offsets", "digest"}, set(), where)
        name = entry["name"]
        if not isinstance(name, str) or not name:
            raise self.fail(f"{where}: name must be a non-empty string")
        dtype = entry["dtype"]
        if dtype not in DTYPE_BITS:
            raise self.fail(f"tensor {name!r}: unknown dtype {dtype!r}")
        shape = tuple(
            self.count(d, f"tensor {name!r}: shape")
            for d in self.array(entry["shape"], f"tensor {name!r}: shape")
        )
        offsets = self.array(entry["data_offsets"], f"tensor {name!r}: data_offsets")
        if len(offsets) != 2:
            raise self.fail(f"tensor {name!r}: data_offsets must have two entries")
        begin, end = (self.count(o, f"tensor {name!r}: data_offsets") for o in offsets)
        numel = 1
        for dim in shape:
            numel *= dim
        if end < begin or numel * DTYPE_BITS[dtype] != (end - begin) * 8:
            raise self.fail(
                f"tensor {name!r}: data_offsets {offsets} do not fit shape {list(shape)} of {dtype}"
            )
        return TensorRecord(
            name=name,
            dtype=dtype,
            shape=shape,
            file=self.path(entry["file"], f"tensor {name!r}: file"),
            data_offsets=(begin, end),
            digest=self.digest(entry["digest"], f"tensor {name!r}: digest"),
        )

    def config(self, value: Any) -> dict[str, str]:
        if not isinstance(value, dict) or not set(value) <= set(CONFIG_FILES):
            raise self.fail(f"config must be an object keyed by {list(CONFIG_FILES)}")
        return {k: self.digest(v, f"config {k}") for k, v in value.items()}

    def cross_check(
        self, files: tuple[FileRecord, ...], tensors: tuple[TensorRecord, ...], weights: tuple[str, ...]
    ) -> None:
        """Entries must be unique, and each safetensors file must be exactly its header plus its tensors."""
        by_path: dict[str, FileRecord] = {}
        for record in files:
            if record.path in by_path:
                raise self.fail(f"file {record.path!r} is listed twice")
            by_path[record.path] = record
        per_file: dict[str, list[TensorRecord]] = {}
        for tensor in tensors:
            shard = by_path.get(tensor.file)
            if shard is None or shard.header_size is None:
                raise self.fail(
                    f"tensor {tensor.name!r}: file {tensor.file!r} is not a listed safetensors file"
                )
            per_file.setdefault(tensor.file, []).append(tensor)
        for record in files:
            if record.header_size is None:
                continue
            position = 0
            names: set[str] = set()
            for tensor in sorted(per_file.get(record.path, []), key=lambda t: t.data_offsets):
                if tensor.data_offsets[0] != position or tensor.name in names:
                    raise self.fail(
                        f"{record.path}: tensor entries do not tile the file (at {tensor.name!r})"
                    )
                names.add(tensor.name)
                position = tensor.data_offsets[1]
            if record.header_size < 8 or record.header_size + position != record.size:
                raise self.fail(f"{record.path}: header_size and tensors do not add up to the file size")
        seen_weights: set[str] = set()
        weight_names: set[str] = set()
        for path in weights:
            if path in seen_weights or path not in by_path or by_path[path].header_size is None:
                raise self.fail(f"weights: {path!r} is not a listed safetensors file (or listed twice)")
            seen_weights.add(path)
            for tensor in per_file.get(path, []):
                if tensor.name in weight_names:
                    raise self.fail(f"weights: tensor {tensor.name!r} appears in two weight files")
                weight_names.add(tensor.name)


_SHARD_EXTRA = frozenset({"tensors"})


def _is_shard_entry(entry: Any) -> bool:
    """A ``ckptpub/2`` file entry with ``header_size``, which then must also have ``tensors``."""
    return isinstance(entry, dict) and "header_size" in entry


def is_safe_relative_path(path: str) -> bool:
    """A '/'-separated path that stays inside its folder: no '..', no absolute, no empty or '.' parts."""
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))
