"""The manifest: plain data with explicit parsing, validation, canonical encoding and identity.

A manifest (``ckptpub.json``, format ``ckptpub/1``, specified in ``docs/format.md``)
lists a digest for every tensor and every file of a checkpoint folder, which files
hold the model's weights, the canonical digest of the model's config, and an
``identity`` derived from the weights and config alone. Parsing validates every
field and recomputes the identity, so a manifest that was edited, truncated or
copied from another checkpoint is refused instead of being trusted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeGuard

from .canonical import canonical_json
from .errors import CkptpubError
from .hashing import DIGEST_PREFIX, digest_bytes
from .safetensors import DTYPE_BITS
from .strict_json import loads_strict

FORMAT = "ckptpub/1"
MANIFEST_NAME = "ckptpub.json"
#: A manifest larger than this is refused unread (about 250k tensors fit).
MAX_MANIFEST_BYTES = 64 << 20
#: Config files whose meaning (not formatting) is part of the identity.
CONFIG_FILES = ("config.json", "adapter_config.json")
_DIGEST = re.compile(re.escape(DIGEST_PREFIX) + "[0-9a-f]{64}")


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


class TensorRecord(NamedTuple):
    """One tensor: where it lies (``file``, ``data_offsets`` relative to the data region) and its digest."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    data_offsets: tuple[int, int]
    digest: str


class FileRecord(NamedTuple):
    """One file of the folder.

    For a safetensors file ``header_size`` is set and ``digest`` covers bytes
    ``[0, header_size)`` only: the rest of the file is exactly its tensors, each
    with a digest of its own, so every byte is hashed once. For any other file
    ``digest`` covers the whole file.
    """

    path: str
    size: int
    digest: str
    header_size: int | None = None


class Manifest(NamedTuple):
    """A parsed, validated manifest. Build one with ``publish``/``build_manifest`` or ``parse_manifest``."""

    identity: str
    tensors: tuple[TensorRecord, ...]
    files: tuple[FileRecord, ...]
    weights: tuple[str, ...]
    config: Mapping[str, str]
    provenance: Mapping[str, object]

    def weight_tensors(self) -> dict[str, TensorRecord]:
        """The model's tensors (those in ``weights`` files) by name."""
        weight_files = set(self.weights)
        return {t.name: t for t in self.tensors if t.file in weight_files}

    def to_json(self) -> bytes:
        """The canonical encoding written to ``ckptpub.json`` (followed by a newline)."""
        return canonical_json(self.to_dict()) + b"\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "identity": self.identity,
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


def compute_identity(
    tensors: tuple[TensorRecord, ...],
    files: tuple[FileRecord, ...],
    weights: tuple[str, ...],
    config: Mapping[str, str],
) -> str:
    """The model's identity: a digest of its weights' names, dtypes, shapes and bytes, and its config.

    Nothing about where the bytes lie (folder, shard names, shard layout, header
    metadata) enters it. A folder with no weight files (an FSDP or DeepSpeed
    layout) falls back to every file's path and digest, so any byte change still
    changes the identity.
    """
    document: dict[str, Any] = {"format": FORMAT, "config": dict(config)}
    if weights:
        weight_files = set(weights)
        document["tensors"] = sorted(
            [t.name, t.dtype, list(t.shape), t.digest] for t in tensors if t.file in weight_files
        )
    else:
        document["files"] = [[f.path, f.size, f.digest] for f in files]
        document["tensors"] = [[t.file, t.name, t.dtype, list(t.shape), t.digest] for t in tensors]
    return digest_bytes(canonical_json(document))


def config_digest(document: Mapping[str, Any]) -> str:
    """Digest of a config's meaning: canonical JSON less the keys that say where or by what it was written."""
    meaningful = {k: v for k, v in document.items() if k not in _VOLATILE_CONFIG_KEYS}
    return digest_bytes(canonical_json(meaningful))


_VOLATILE_CONFIG_KEYS = frozenset({"_name_or_path", "transformers_version", "_commit_hash"})


def parse_manifest(data: bytes, display_name: str = MANIFEST_NAME) -> Manifest:
    """Parse and fully validate manifest bytes; raise ``CkptpubError`` naming the first problem."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise CkptpubError(
            f"{display_name}: {len(data)} bytes is over the {MAX_MANIFEST_BYTES}-byte manifest limit"
        )
    document = loads_strict(data, display_name, "manifest")
    return _Validator(display_name).manifest(document)


class _Validator:
    """Checks one decoded manifest document; each error names the field at fault."""

    def __init__(self, display_name: str) -> None:
        self.name = display_name

    def fail(self, message: str) -> CkptpubError:
        return CkptpubError(f"{self.name}: {message}")

    def manifest(self, document: Any) -> Manifest:
        if not isinstance(document, dict):
            raise self.fail("manifest is not a JSON object")
        version = document.get("format")
        if version != FORMAT:
            raise self.fail(f"unsupported manifest format {version!r} (this ckptpub reads {FORMAT!r})")
        expected = {"format", "identity", "config", "weights", "tensors", "files", "provenance"}
        if set(document) != expected:
            extra, missing = set(document) - expected, expected - set(document)
            raise self.fail(f"manifest fields {sorted(extra)} unexpected, {sorted(missing)} missing")
        files = tuple(self.file(entry, i) for i, entry in enumerate(self.array(document["files"], "files")))
        tensors = tuple(
            self.tensor(entry, i) for i, entry in enumerate(self.array(document["tensors"], "tensors"))
        )
        weights = tuple(self.path(p, "weights") for p in self.array(document["weights"], "weights"))
        config = self.config(document["config"])
        provenance = document["provenance"]
        if not isinstance(provenance, dict):
            raise self.fail("provenance is not an object")
        self.cross_check(files, tensors, weights)
        identity = document["identity"]
        if not is_digest(identity):
            raise self.fail(f"identity {identity!r} is not a blake3 digest")
        if identity != compute_identity(tensors, files, weights, config):
            raise self.fail(
                "recorded identity does not match the manifest's own entries (edited or corrupt manifest)"
            )
        return Manifest(identity, tensors, files, weights, config, provenance)

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

    def file(self, entry: Any, index: int) -> FileRecord:
        where = f"files[{index}]"
        entry = self.fields(entry, {"path", "size", "digest"}, {"header_size"}, where)
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


def is_safe_relative_path(path: str) -> bool:
    """A '/'-separated path that stays inside its folder: no '..', no absolute, no empty or '.' parts."""
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))
