"""The manifest: plain data with explicit parsing, validation, canonical encoding and identity.

A manifest (``ckptpub.json``, specified in ``docs/format.md``) lists a digest for
every tensor and every file of a checkpoint folder, which files hold the model's
weights, the digest of the model config's meaning, and an ``identity`` derived
from the weights and config alone. Parsing validates every field and recomputes
the identity, so a manifest that was edited, truncated or copied from another
checkpoint is refused instead of being trusted.

Writers write ``ckptpub/3``: one JSON document in one exact byte layout, a first
line of small fields (with the byte size of each region), then the model and layout
regions, one tensor entry a line (``regions``). The identity commits to the model
region's bytes, so reading a manifest and checking its identity at 100k tensors is
one BLAKE3 pass and no per-tensor work; the entries are decoded, and checked to be
in their one canonical form, on first use of ``Manifest.tensors`` or ``model()``.
It is the one format read. Nothing was released before it settled, so the older
ones (``ckptpub/1``, one JSON document; ``ckptpub/2``, a JSON header line then two
text tables) are recognised only to be refused in one line that says how to publish
the folder again.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from itertools import pairwise
from operator import attrgetter
from posixpath import dirname
from typing import Any, TypeGuard

from ..errors import CkptpubError
from .canonical import canonical_json
from .config_meaning import meaning
from .digest import DIGEST_PREFIX, digest_bytes
from .names import CONFIG_FILES, MANIFEST_NAME
from .records import (
    Decoded,
    FileRecord,
    ModelEntry,
    ShardTensors,
    TensorRecord,
    decoded_from_records,
    model_entries,
)
from .regions import (
    BETWEEN,
    END,
    Regions,
    check_shapes,
    decode_model,
    decode_regions,
    encode_regions,
    entries_of,
    entry_count,
    model_region,
)
from .strict_json import loads_strict

#: The manifest format read and written.
FORMAT = "ckptpub/3"
#: Formats of the days before ``FORMAT`` settled: never released, refused by name.
_RETIRED = frozenset({"ckptpub/1", "ckptpub/2"})
#: A manifest larger than this is refused unread (about 300k tensors fit).
MAX_MANIFEST_BYTES = 64 << 20
_DIGEST = re.compile(re.escape(DIGEST_PREFIX) + "[0-9a-f]{64}")
#: A ckptpub/3 manifest's first line: these fields in this order, each value canonical JSON.
_HEADER_FIELDS = ("format", "identity", "sizes", "config", "weights", "files", "provenance")
_V3_START = b'{"format":"ckptpub/3",'
_MODEL_OPEN = b',"model":['
_DIGEST_OF = attrgetter("digest")

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

    The entries of a manifest's regions are decoded on first use (``check``,
    ``decoded``, ``tensors``), once, raising ``CkptpubError`` if they break a rule;
    ``identity``, ``files``, ``weights``, ``config`` and ``provenance`` are checked
    when the manifest is parsed.
    """

    __slots__ = (
        "identity",
        "files",
        "weights",
        "config",
        "provenance",
        "_tensors",
        "_decoded",
        "_shards",
        "_source",
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
    ) -> None:
        self.identity = identity
        self.files = files
        self.weights = weights
        self.config = config
        self.provenance = provenance
        self._tensors: tuple[TensorRecord, ...] | None = tensors
        self._decoded: Decoded | None = None
        self._shards: dict[str, ShardTensors] | None = None
        #: The encoded entries: the regions read, or encoded once.
        self._source: Regions | None = None
        self._name = MANIFEST_NAME

    @classmethod
    def lazy(
        cls,
        identity: str,
        source: Regions,
        files: tuple[FileRecord, ...],
        weights: tuple[str, ...],
        config: Mapping[str, str],
        provenance: Mapping[str, object],
        display_name: str = MANIFEST_NAME,
    ) -> Manifest:
        """A manifest whose tensor records are decoded from ``source`` when first asked for."""
        manifest = cls(identity, (), files, weights, config, provenance)
        manifest._tensors, manifest._source, manifest._name = None, source, display_name
        return manifest

    def __eq__(self, other: object) -> bool:
        """Equal manifests list the same entries (their regions' bytes) and the same header fields."""
        if not isinstance(other, Manifest):
            return NotImplemented
        fields = ("identity", "files", "weights", "config", "provenance")
        return all(getattr(self, f) == getattr(other, f) for f in fields) and self.regions == other.regions

    __hash__ = None  # type: ignore[assignment]  # mutable caches inside; as a NamedTuple of dicts it had none

    def __repr__(self) -> str:
        return f"Manifest(identity={self.identity!r}, {self.tensor_count} tensors, {len(self.files)} files)"

    @property
    def tensors(self) -> tuple[TensorRecord, ...]:
        """Every tensor, in file then offset order."""
        if self._tensors is None:
            self._tensors = self.decoded().records()
        return self._tensors

    def decoded(self) -> Decoded:
        """Every entry as columns, once every rule holds: the model part, and each shard's tensors.

        Decoded once, on first use; what ``verify`` and ``diff`` work with at 100k
        tensors instead of a record per tensor.
        """
        if self._decoded is None:
            if self._source is not None:
                self._decoded = decode_regions(self._source, self.files, self.weights, self._name)
            else:
                assert self._tensors is not None
                self._decoded = decoded_from_records(self._tensors, self.files, self.weights)
        return self._decoded

    def shards(self) -> dict[str, ShardTensors]:
        """Each safetensors file's tensors by path, as columns placed by tiling (made once, on first use)."""
        if self._shards is None:
            self._shards = {tensors.shard.path: tensors for tensors in self.decoded().shards()}
        return self._shards

    @property
    def regions(self) -> Regions:
        """The regions (the identity covers the model region's bytes); a manifest of records encodes once."""
        if self._source is None:
            self._source = _regions_of(self.tensors, self.files, self.weights)
        return self._source

    @property
    def tensor_count(self) -> int:
        """How many tensors the manifest lists (without decoding them)."""
        if self._tensors is not None:
            return len(self._tensors)
        assert self._source is not None
        return entry_count(self._source.layout)

    @property
    def model_tensor_count(self) -> int:
        """How many tensors the weight files hold (without decoding them)."""
        if self._decoded is not None:
            return len(self._decoded.model.names)
        if self._tensors is not None:
            return len(self.weight_tensors())
        assert self._source is not None
        return entry_count(self._source.model)

    def check(self) -> Manifest:
        """Check every rule now, the entries' too (decoding them once); ``CkptpubError`` names the first.

        ``parse_manifest`` and ``read_manifest`` call it unless told not to, so every
        command that says whether a manifest is usable (``show``, ``ls``, ``verify``,
        ``diff``, an engine's start) gives the same answer; only a reader that needs
        the identity alone (a weight-cache key) skips it, as ``docs/format.md`` allows.
        """
        self.decoded()
        return self

    def model(self) -> dict[str, ModelEntry]:
        """The model's tensors by name, as the identity covers them (dtype, shape, digest; no place).

        For a manifest read from a file this decodes the model region alone, far
        faster than ``weight_tensors`` at 100k tensors.
        """
        if self._decoded is not None:
            return model_entries(self._decoded.model)
        if self._tensors is None and self._source is not None:
            return decode_model(self._source.model, self._name)
        return {t.name: ModelEntry(t.dtype, t.shape, t.digest) for t in self.weight_tensors().values()}

    def weight_tensors(self) -> dict[str, TensorRecord]:
        """The model's tensors (those in ``weights`` files) by name."""
        weight_files = set(self.weights)
        return {t.name: t for t in self.tensors if t.file in weight_files}

    def to_json(self) -> bytes:
        """The bytes written to ``ckptpub.json``.

        Raises ``CkptpubError`` for a manifest built by hand whose provenance is not
        plain JSON data (``publish`` refuses that earlier).
        """
        try:
            return self._encoded()
        except (TypeError, ValueError, RecursionError) as error:  # canonical_json: not plain JSON data
            raise CkptpubError(f"{self._name}: cannot be encoded as {FORMAT}: {error}") from None

    def _encoded(self) -> bytes:
        regions = self.regions
        header = {
            "format": FORMAT,
            "identity": identity_of(regions, self.files, self.weights, self.config),
            "sizes": {"model": len(regions.model), "layout": len(regions.layout)},
            "config": dict(self.config),
            "weights": list(self.weights),
            "files": _files_json(self.files, regions.counts),
            "provenance": dict(self.provenance),
        }
        return b"".join((_header_line(header), regions.model, BETWEEN, regions.layout, END))


def _header_line(header: Mapping[str, Any]) -> bytes:
    """A ckptpub/3 manifest's first line: ``_HEADER_FIELDS`` in order, values canonical, ``"model":[``."""
    fields = (b'"' + name.encode() + b'":' + canonical_json(header[name]) for name in _HEADER_FIELDS)
    return b"{" + b",".join(fields) + _MODEL_OPEN + b"\n"


def _by_file(tensors: Sequence[TensorRecord]) -> dict[str, list[TensorRecord]]:
    """The records of each file, in the records' order."""
    grouped: dict[str, list[TensorRecord]] = {}
    for t in tensors:
        grouped.setdefault(t.file, []).append(t)
    return grouped


def _regions_of(
    tensors: Sequence[TensorRecord], files: Sequence[FileRecord], weights: Sequence[str]
) -> Regions:
    check_shapes(tensors, MANIFEST_NAME)
    by_file = _by_file(tensors)
    return encode_regions(
        files, weights, {path: entries_of(ts, map(_DIGEST_OF, ts)) for path, ts in by_file.items()}
    )


def _files_json(files: Sequence[FileRecord], counts: Sequence[int]) -> list[dict[str, Any]]:
    """``files`` as the first line lists them: a shard with ``header_size`` and tensor count."""
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
) -> str:
    """The model's identity: a digest of its weights' names, dtypes, shapes and bytes, and its config.

    Nothing about where the bytes lie (folder, shard names, shard layout, header
    metadata) enters it. A folder with no weight files (an FSDP or DeepSpeed
    layout) falls back to every file's path and digest, so any byte change still
    changes the identity. ``config`` holds the config files' digests (``config_digest``).
    """
    if not weights:
        return identity_of(_regions_of(tensors, files, weights), files, weights, config)
    weight_files = set(weights)
    model = [t for t in tensors if t.file in weight_files]
    check_shapes(model, MANIFEST_NAME)  # the writer's rules apply: a shape dimension below 2**53
    region = model_region(entries_of(model, map(_DIGEST_OF, model)))
    return identity_of(Regions(region, b"", ()), files, weights, config)


def identity_of(
    encoded: Regions, files: Sequence[FileRecord], weights: Sequence[str], config: Mapping[str, str]
) -> str:
    """The identity: one BLAKE3 pass over the model region, then a small document (``docs/format.md``)."""
    document: dict[str, Any] = {
        "format": FORMAT,
        "config": dict(config),
        "model": digest_bytes(encoded.model),
    }
    if not weights:
        document["files"] = _files_json(files, encoded.counts)
        document["layout"] = digest_bytes(encoded.layout)
    return digest_bytes(canonical_json(document))


def config_digest(document: Mapping[str, Any]) -> str:
    """Digest of a config's meaning (``config_meaning``): canonical JSON of it."""
    return digest_bytes(canonical_json(meaning(document)))


def config_meaning(data: bytes, name: str) -> tuple[dict[str, Any], str]:
    """A config file's bytes as its JSON object and the digest of its meaning.

    Read strictly (``loads_strict``), so every reader of a config (publish, verify,
    diff, the vLLM plugin's engine-file check) sees one meaning or the same
    ``CkptpubError`` naming ``name``: not JSON, not an object, or not canonically encodable.
    """
    document = loads_strict(data, name, "config")
    if not isinstance(document, dict):
        raise CkptpubError(f"{name}: config is not a JSON object")
    try:
        return document, config_digest(document)
    except (ValueError, RecursionError) as error:  # nested deeper than canonical encoding goes
        raise CkptpubError(f"{name}: config cannot be encoded canonically: {error}") from None


def parse_manifest(data: bytes, display_name: str = MANIFEST_NAME, *, check_tables: bool = True) -> Manifest:
    """Parse and validate ``ckptpub/3`` manifest bytes; ``CkptpubError`` names a problem.

    Every rule is checked (``Manifest.check``). With ``check_tables=False`` the
    first line, sizes and identity are checked, the regions entry by entry only when
    the tensors are first used: for a reader that needs the identity alone.
    """
    if len(data) > MAX_MANIFEST_BYTES:
        raise CkptpubError(
            f"{display_name}: {len(data)} bytes is over the {MAX_MANIFEST_BYTES}-byte manifest limit"
        )
    if not data.startswith(_V3_START):
        raise _refusal(data, display_name)
    manifest = _Validator(display_name).manifest_v3(data)
    return manifest.check() if check_tables else manifest


def _refusal(data: bytes, display_name: str) -> CkptpubError:
    """Why bytes that do not begin as ``ckptpub/3`` does are not a manifest, naming the format they say.

    ``ckptpub/2`` is a JSON header line followed by tables, so its format is on the
    first line; ``ckptpub/1`` is one JSON document, maybe over several lines, so
    the whole is read when the first line is not JSON.
    """
    newline = data.find(b"\n")
    try:
        document = loads_strict(data if newline < 0 else data[:newline], display_name, "manifest")
    except CkptpubError:  # a document over several lines (or no JSON at all: that error, then)
        document = loads_strict(data, display_name, "manifest")
    version = document.get("format") if isinstance(document, dict) else None
    if isinstance(version, str) and version in _RETIRED:
        folder = shlex.quote(dirname(display_name) or ".")
        return CkptpubError(
            f"{display_name}: format {version!r} is no longer read (ckptpub reads {FORMAT!r}); "
            f"publish it again: ckptpub publish {folder}"
        )
    if version == FORMAT:
        return CkptpubError(
            f"{display_name}: a {FORMAT!r} manifest must be in its exact layout "
            "(was it re-formatted or edited?)"
        )
    if not isinstance(document, dict):
        return CkptpubError(f"{display_name}: manifest is not a JSON object")
    return CkptpubError(
        f"{display_name}: unsupported manifest format {version!r} (this ckptpub reads {FORMAT!r})"
    )


class _Validator:
    """Checks one decoded manifest document; each error names the field at fault."""

    def __init__(self, display_name: str) -> None:
        self.name = display_name

    def fail(self, message: str) -> CkptpubError:
        return CkptpubError(f"{self.name}: {message}")

    def fields_of(self, document: dict[str, Any], expected: set[str]) -> dict[str, Any]:
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

    def manifest_v3(self, data: bytes) -> Manifest:
        """The first line is checked field by field and byte for byte; regions: size, count, identity."""
        newline = data.find(b"\n")
        if newline < 0 or not data[:newline].endswith(_MODEL_OPEN):
            raise self.fail(f'a {FORMAT!r} manifest\'s first line must end with ,"model":[')
        header = loads_strict(data[: newline - len(_MODEL_OPEN)] + b"}", self.name, "manifest header")
        document = self.fields_of(header, set(_HEADER_FIELDS))
        files, counts = self.files_with_counts(document["files"])
        weights = self.weights_of(document["weights"], files)
        sizes = self.fields(document["sizes"], {"model", "layout"}, set(), "sizes")
        start = newline + 1
        model_end = start + self.count(sizes["model"], "sizes: model")
        layout_start = model_end + len(BETWEEN)
        layout_end = layout_start + self.count(sizes["layout"], "sizes: layout")
        if (
            len(data) != layout_end + len(END)
            or data[model_end:layout_start] != BETWEEN
            or data[layout_end:] != END
        ):
            raise self.fail(f"regions do not have the sizes the first line says ({len(data)} bytes in all)")
        config = self.config(document["config"])
        if _header_line(document) != data[:start]:
            raise self.fail("first line is not in canonical form (fields in order, canonical JSON values)")
        # Entry counts are checked with the entries (decode_regions): counting 18 MB of line breaks
        # would be a third of reading the manifest, and the key needs only the identity.
        view = memoryview(data)
        regions = Regions(view[start:model_end], view[layout_start:layout_end], tuple(counts))
        if document["identity"] != identity_of(regions, files, weights, config):
            raise self.mismatch()
        return Manifest.lazy(
            document["identity"], regions, tuple(files), weights, config, document["provenance"], self.name
        )

    def files_with_counts(self, value: Any) -> tuple[list[FileRecord], list[int]]:
        """The first line's ``files``, sorted and unique, and each shard's tensor count."""
        counts: list[int] = []
        files = []
        for index, entry in enumerate(self.array(value, "files")):
            record = self.file(entry, index, _SHARD_EXTRA if _is_shard_entry(entry) else frozenset())
            if record.header_size is not None:
                counts.append(self.count(entry["tensors"], f"{record.path}: tensors"))
            files.append(record)
        if any(a.path >= b.path for a, b in pairwise(files)):
            raise self.fail("files are not sorted by path, or a file is listed twice")
        return files, counts

    def weights_of(self, value: Any, files: list[FileRecord]) -> tuple[str, ...]:
        """The first line's ``weights``: sorted listed safetensors files, each once."""
        weights = tuple(self.path(p, "weights") for p in self.array(value, "weights"))
        shards = {f.path for f in files if f.header_size is not None}
        if any(a >= b for a, b in pairwise(weights)) or not set(weights) <= shards:
            raise self.fail("weights: not sorted listed safetensors files, each once")
        return weights

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

    def config(self, value: Any) -> dict[str, str]:
        if not isinstance(value, dict) or not set(value) <= set(CONFIG_FILES):
            raise self.fail(f"config must be an object keyed by {list(CONFIG_FILES)}")
        return {k: self.digest(v, f"config {k}") for k, v in value.items()}


_SHARD_EXTRA = frozenset({"tensors"})


def _is_shard_entry(entry: Any) -> bool:
    """A file entry with ``header_size`` (a safetensors file), which then must also have ``tensors``."""
    return isinstance(entry, dict) and "header_size" in entry


def is_safe_relative_path(path: str) -> bool:
    """A '/'-separated path that stays inside its folder: no '..', no absolute, no empty or '.' parts."""
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))
