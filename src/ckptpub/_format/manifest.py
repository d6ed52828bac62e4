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
Readers still read ``ckptpub/2`` (a JSON header line and two text tables,
``tables``) and ``ckptpub/1`` (one JSON document of objects, fully validated at
once). Each manifest keeps its own format's identity and config rule
(``config_meaning``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from itertools import pairwise
from operator import attrgetter
from typing import Any, TypeGuard

from ..errors import CkptpubError
from .canonical import canonical_json
from .config_meaning import meaning, same_rule
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
    decode_regions,
    encode_regions,
    entries_of,
    entry_count,
    model_region,
)
from .regions import decode_model as decode_model_region
from .safetensors import DTYPE_BITS
from .strict_json import loads_strict
from .tables import Tables, check_name, decode_model, decode_tables, encode_tables, line, model_table

FORMAT = "ckptpub/3"
#: Formats still read, and written by ``Manifest.to_json(version)`` for a manifest of their own rule.
FORMAT_V2 = "ckptpub/2"
FORMAT_V1 = "ckptpub/1"
#: Every format read, oldest first.
FORMATS = (FORMAT_V1, FORMAT_V2, FORMAT)
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

    The entries of a ``ckptpub/3`` manifest's regions (or a ``/2`` manifest's tables)
    are decoded on first use (``check``, ``decoded``, ``tensors``), once, raising
    ``CkptpubError`` if they break a rule;
    ``identity``, ``files``, ``weights``, ``config`` and ``provenance`` are checked
    when the manifest is parsed. ``version`` is the format whose rules ``identity``
    and ``config`` follow.
    """

    __slots__ = (
        "identity",
        "files",
        "weights",
        "config",
        "provenance",
        "version",
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
        version: str = FORMAT,
    ) -> None:
        #: The format whose identity and config digests these are (one read from an older file keeps its own).
        self.version = version
        self.identity = identity
        self.files = files
        self.weights = weights
        self.config = config
        self.provenance = provenance
        self._tensors: tuple[TensorRecord, ...] | None = tensors
        self._decoded: Decoded | None = None
        self._shards: dict[str, ShardTensors] | None = None
        #: The encoded entries: ckptpub/3 regions (read, or encoded once), or the ckptpub/2 tables read.
        self._source: Regions | Tables | None = None
        self._name = MANIFEST_NAME

    @classmethod
    def lazy(
        cls,
        identity: str,
        source: Regions | Tables,
        files: tuple[FileRecord, ...],
        weights: tuple[str, ...],
        config: Mapping[str, str],
        provenance: Mapping[str, object],
        display_name: str = MANIFEST_NAME,
    ) -> Manifest:
        """A manifest whose tensor records are decoded from ``source`` when first asked for."""
        version = FORMAT if isinstance(source, Regions) else FORMAT_V2
        manifest = cls(identity, (), files, weights, config, provenance, version)
        manifest._tensors, manifest._source, manifest._name = None, source, display_name
        return manifest

    def __eq__(self, other: object) -> bool:
        """Equal manifests list the same entries (their regions' bytes) and the same header fields."""
        if not isinstance(other, Manifest):
            return NotImplemented
        fields = ("version", "identity", "files", "weights", "config", "provenance")
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
            source = self._source
            if isinstance(source, Regions):
                self._decoded = decode_regions(source, self.files, self.weights, self._name)
            elif isinstance(source, Tables):
                self._decoded = decode_tables(source, self.files, self.weights, self._name)
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
        """The ``ckptpub/3`` regions (the model region's bytes are what a ``/3`` identity covers)."""
        if not isinstance(self._source, Regions):
            regions = _regions_of(self.tensors, self.files, self.weights)
            if self._source is None:  # a manifest of records: keep the encoding (a /2 one keeps its tables)
                self._source = regions
            return regions
        return self._source

    @property
    def tensor_count(self) -> int:
        """How many tensors the manifest lists (without decoding them)."""
        if self._tensors is not None:
            return len(self._tensors)
        if isinstance(self._source, Regions):
            return entry_count(self._source.layout)
        assert self._source is not None
        return self._source.layout.count(b"\n")

    @property
    def model_tensor_count(self) -> int:
        """How many tensors the weight files hold (without decoding them)."""
        if self._decoded is not None:
            return len(self._decoded.model.names)
        if self._tensors is not None:
            return len(self.weight_tensors())
        if isinstance(self._source, Regions):
            return entry_count(self._source.model)
        assert self._source is not None
        return self._source.model.count(b"\n")

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

        For a manifest read from a file this decodes the model region (or table)
        alone, far faster than ``weight_tensors`` at 100k tensors.
        """
        if self._decoded is not None:
            return model_entries(self._decoded.model)
        if self._tensors is None and isinstance(self._source, Regions):
            return decode_model_region(self._source.model, self._name)
        if self._tensors is None and isinstance(self._source, Tables):
            return decode_model(self._source.model, self._name)
        return {t.name: ModelEntry(t.dtype, t.shape, t.digest) for t in self.weight_tensors().values()}

    def weight_tensors(self) -> dict[str, TensorRecord]:
        """The model's tensors (those in ``weights`` files) by name."""
        weight_files = set(self.weights)
        return {t.name: t for t in self.tensors if t.file in weight_files}

    def identity_in(self, version: str, configs: Mapping[str, Mapping[str, Any]]) -> str:
        """The identity this manifest's model has under format ``version``'s rules.

        ``configs`` holds the documents of the config files the manifest records
        (``config.json``, ...): their digests under ``version``'s rule are computed
        from them, after checking that each has the digest this manifest recorded
        (``CkptpubError`` otherwise). What an engine keys a weight-cache daemon by
        when the daemon was started before the folder was published in a newer format.
        """
        digests = {}
        for name, recorded in self.config.items():
            document = configs.get(name)
            if document is None or config_digest(document, self.version) != recorded:
                raise CkptpubError(f"{name}: not the config this manifest recorded")
            digests[name] = config_digest(document, version)
        return compute_identity(self.tensors, self.files, self.weights, digests, version)

    def to_json(self, version: str = FORMAT) -> bytes:
        """The bytes written to ``ckptpub.json``: ``ckptpub/3``, or an older format when asked.

        The identity written is the one ``version`` defines (each format's differs).
        Raises ``CkptpubError`` for a ``version`` with no encoding, for a manifest
        whose config digests follow another format's rule (a ``/2`` manifest's include
        ``use_cache``: its config's meaning under ``version``'s rule is not known;
        publish the folder again instead), and for a manifest built by hand whose
        provenance is not plain JSON data (``publish`` refuses that earlier).
        """
        try:
            return self._encoded(version)
        except (TypeError, ValueError, RecursionError) as error:  # canonical_json: not plain JSON data
            raise CkptpubError(f"{self._name}: cannot be encoded as {version}: {error}") from None

    def _encoded(self, version: str) -> bytes:
        if version not in FORMATS:
            raise CkptpubError(
                f"no encoding for manifest format {version!r} "
                f"(this ckptpub writes {', '.join(map(repr, reversed(FORMATS)))})"
            )
        if self.config and not same_rule(version, self.version):
            raise CkptpubError(
                f"a {self.version} manifest's config digests follow that format's rule; it cannot be "
                f"written as {version} (publish the folder again)"
            )
        if version == FORMAT_V1:
            return canonical_json(self._v1_document()) + b"\n"
        if version == FORMAT_V2:
            return self._v2_bytes()
        regions = self.regions
        header = {
            "format": FORMAT,
            "identity": identity_of(regions, self.files, self.weights, self.config, FORMAT),
            "sizes": {"model": len(regions.model), "layout": len(regions.layout)},
            "config": dict(self.config),
            "weights": list(self.weights),
            "files": _files_json(self.files, regions.counts),
            "provenance": dict(self.provenance),
        }
        return b"".join((_header_line(header), regions.model, BETWEEN, regions.layout, END))

    def _v2_bytes(self) -> bytes:
        tables = (
            self._source
            if isinstance(self._source, Tables)
            else _tables_of(self.tensors, self.files, self.weights)
        )
        header = {
            "format": FORMAT_V2,
            "identity": identity_of(tables, self.files, self.weights, self.config, FORMAT_V2),
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


def _tables_of(
    tensors: Sequence[TensorRecord], files: Sequence[FileRecord], weights: Sequence[str]
) -> Tables:
    by_file = _by_file(tensors)
    return encode_tables(
        files, weights, {path: [(t.name, _line(t)) for t in ts] for path, ts in by_file.items()}
    )


def _line(t: TensorRecord) -> str:
    """A ckptpub/2 table line, refusing a name it cannot hold."""
    check_name(t.name, t.file)
    return line(t.name, t.dtype, t.shape, t.digest)


def _files_json(files: Sequence[FileRecord], counts: Sequence[int]) -> list[dict[str, Any]]:
    """``files`` as a ``/2`` or ``/3`` header lists them: a shard with ``header_size`` and tensor count."""
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
    changes the identity. ``version`` picks the format's preimage (they differ);
    ``config`` holds digests taken with that format's rule (``config_digest``).
    """
    if not weights and version == FORMAT:
        return identity_of(_regions_of(tensors, files, weights), files, weights, config, version)
    if not weights and version == FORMAT_V2:
        return identity_of(_tables_of(tensors, files, weights), files, weights, config, version)
    weight_files = set(weights)
    model = [t for t in tensors if t.file in weight_files]
    if version == FORMAT:  # the writer's rules apply: a shape dimension below 2**53 ...
        check_shapes(model, MANIFEST_NAME)
        region = model_region(entries_of(model, map(_DIGEST_OF, model)))
        return identity_of(Regions(region, b"", ()), files, weights, config, version)
    if version == FORMAT_V2:  # ... and no tab or newline in a name
        table = model_table([(t.name, _line(t)) for t in model])
        return identity_of(Tables(table, b"", ()), files, weights, config, version)
    document: dict[str, Any] = {"format": FORMAT_V1, "config": dict(config)}
    if weights:
        document["tensors"] = sorted([t.name, t.dtype, list(t.shape), t.digest] for t in model)
    else:
        document["files"] = [[f.path, f.size, f.digest] for f in files]
        document["tensors"] = [[t.file, t.name, t.dtype, list(t.shape), t.digest] for t in tensors]
    return digest_bytes(canonical_json(document))


def identity_of(
    encoded: Regions | Tables,
    files: Sequence[FileRecord],
    weights: Sequence[str],
    config: Mapping[str, str],
    version: str,
) -> str:
    """A ``ckptpub/3`` or ``/2`` identity: one BLAKE3 pass over the model region (or table), a small document.

    The two formats' preimages have the same shape and differ in ``format`` (and in
    what their model bytes and config digests are).
    """
    document: dict[str, Any] = {
        "format": version,
        "config": dict(config),
        "model": digest_bytes(encoded.model),
    }
    if not weights:
        document["files"] = _files_json(files, encoded.counts)
        document["layout"] = digest_bytes(encoded.layout)
    return digest_bytes(canonical_json(document))


def config_digest(document: Mapping[str, Any], version: str = FORMAT) -> str:
    """Digest of a config's meaning under ``version``'s rule (``config_meaning``): canonical JSON of it."""
    return digest_bytes(canonical_json(meaning(document, version)))


def config_meaning(data: bytes, name: str, version: str) -> tuple[dict[str, Any], str]:
    """A config file's bytes as its JSON object and the digest of its meaning under ``version``'s rule.

    Read strictly (``loads_strict``), so every reader of a config (publish, verify,
    diff, the vLLM plugin's engine-file check) sees one meaning or the same
    ``CkptpubError`` naming ``name``: not JSON, not an object, or not canonically encodable.
    """
    document = loads_strict(data, name, "config")
    if not isinstance(document, dict):
        raise CkptpubError(f"{name}: config is not a JSON object")
    try:
        return document, config_digest(document, version)
    except (ValueError, RecursionError) as error:  # nested deeper than canonical encoding goes
        raise CkptpubError(f"{name}: config cannot be encoded canonically: {error}") from None


def parse_manifest(data: bytes, display_name: str = MANIFEST_NAME, *, check_tables: bool = True) -> Manifest:
    """Parse and validate manifest bytes (``ckptpub/3``, ``/2``, ``/1``); ``CkptpubError`` names a problem.

    Every rule is checked (``Manifest.check``). With ``check_tables=False`` a
    ``ckptpub/3`` manifest's header, layout, sizes and identity are checked, its
    regions entry by entry only when its tensors are first used (``/2``: its tables,
    line by line): for a reader that needs the identity alone.
    """
    if len(data) > MAX_MANIFEST_BYTES:
        raise CkptpubError(
            f"{display_name}: {len(data)} bytes is over the {MAX_MANIFEST_BYTES}-byte manifest limit"
        )
    validator = _Validator(display_name)
    if data.startswith(_V3_START):
        manifest = validator.manifest_v3(data)
        return manifest.check() if check_tables else manifest
    newline = data.find(b"\n")
    # A view: the tables are copied once, each into its own bytes, not first as one remainder.
    head, rest = (data, memoryview(b"")) if newline < 0 else (data[:newline], memoryview(data)[newline + 1 :])
    try:
        document = loads_strict(head, display_name, "manifest")
    except (
        CkptpubError
    ):  # a ckptpub/1 document over several lines (or a re-formatted /3 one), or no JSON at all
        return validator.manifest_v1(loads_strict(data, display_name, "manifest"))
    if isinstance(document, dict) and document.get("format") == FORMAT_V2:
        manifest = validator.manifest_v2(document, rest)
        return manifest.check() if check_tables else manifest
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
        if version not in FORMATS:
            raise self.fail(
                f"unsupported manifest format {version!r} "
                f"(this ckptpub reads {FORMAT!r}, {FORMAT_V2!r} and {FORMAT_V1!r})"
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

    def manifest_v3(self, data: bytes) -> Manifest:
        """The first line is checked field by field and byte for byte; regions: size, count, identity."""
        newline = data.find(b"\n")
        if newline < 0 or not data[:newline].endswith(_MODEL_OPEN):
            raise self.fail(f'a {FORMAT!r} manifest\'s first line must end with ,"model":[')
        header = loads_strict(data[: newline - len(_MODEL_OPEN)] + b"}", self.name, "manifest header")
        document = self.fields_of(header, set(_HEADER_FIELDS))
        files, counts = self.files_with_counts(document["files"])
        weights, _ = self.weights_of(document["weights"], files, counts)
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
        if document["identity"] != identity_of(regions, files, weights, config, FORMAT):
            raise self.mismatch()
        return Manifest.lazy(
            document["identity"], regions, tuple(files), weights, config, document["provenance"], self.name
        )

    def manifest_v2(self, document: Any, rest: memoryview) -> Manifest:
        """The header is checked field by field; the tables by size, line counts and the identity."""
        expected = {"format", "identity", "config", "weights", "tables", "files", "provenance"}
        document = self.fields_of(document, expected)
        files, counts = self.files_with_counts(document["files"])
        weights, weight_count = self.weights_of(document["weights"], files, counts)
        sizes = self.fields(document["tables"], {"model", "layout"}, set(), "tables")
        model_size = self.count(sizes["model"], "tables: model")
        layout_size = self.count(sizes["layout"], "tables: layout")
        if model_size + layout_size != len(rest):
            raise self.fail(f"tables hold {len(rest)} bytes, the header says {model_size + layout_size}")
        tables = Tables(bytes(rest[:model_size]), bytes(rest[model_size:]), tuple(counts))
        if tables.model.count(b"\n") != weight_count or tables.layout.count(b"\n") != sum(counts):
            raise self.fail("tables: line counts do not match the files' tensor counts")
        config = self.config(document["config"])
        if document["identity"] != identity_of(tables, files, weights, config, FORMAT_V2):
            raise self.mismatch()
        return Manifest.lazy(
            document["identity"], tables, tuple(files), weights, config, document["provenance"], self.name
        )

    def files_with_counts(self, value: Any) -> tuple[list[FileRecord], list[int]]:
        """A ``/2`` or ``/3`` header's ``files``, sorted and unique, and each shard's tensor count."""
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

    def weights_of(
        self, value: Any, files: list[FileRecord], counts: list[int]
    ) -> tuple[tuple[str, ...], int]:
        """A ``/2`` or ``/3`` header's ``weights`` (sorted listed shards, each once), their tensor count."""
        weights = tuple(self.path(p, "weights") for p in self.array(value, "weights"))
        shard_counts = dict(zip((f.path for f in files if f.header_size is not None), counts, strict=True))
        if any(a >= b for a, b in pairwise(weights)) or not set(weights) <= shard_counts.keys():
            raise self.fail("weights: not sorted listed safetensors files, each once")
        return weights, sum(shard_counts[w] for w in weights)

    def manifest_v1(self, document: Any) -> Manifest:
        expected = {"format", "identity", "config", "weights", "tensors", "files", "provenance"}
        if isinstance(document, dict) and document.get("format") in (FORMAT, FORMAT_V2):
            layout = (
                "its exact layout" if document["format"] == FORMAT else "its tables after a one-line header"
            )
            raise self.fail(
                f"a {document['format']!r} manifest must be in {layout} (was it re-formatted or edited?)"
            )
        document = self.fields_of(document, expected)
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
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:  # a list or an object cannot be looked up
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
