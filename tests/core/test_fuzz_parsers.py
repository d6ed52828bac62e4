"""Fuzzing the parsers of untrusted bytes: only CkptpubError may escape, and what is accepted is sound."""

from __future__ import annotations

import contextlib
import json
import math
from math import prod
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.checkpoints import v3_forged, v3_parts, v3_written

import ckptpub
from ckptpub._format.canonical import canonical_json
from ckptpub._format.manifest import FileRecord, Manifest, TensorRecord, compute_identity, parse_manifest
from ckptpub._format.names import CONFIG_FILES
from ckptpub._format.safetensors import DTYPE_BITS, parse_header

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)
tensor_entries = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(["F32", "BF16", "F4", "I64", "BOOL", "X"]),
        "shape": st.lists(st.integers(-2, 6), max_size=3),
        "data_offsets": st.lists(st.integers(-2, 64), min_size=2, max_size=2),
    }
)


@settings(max_examples=400, deadline=None)
@given(header=st.binary(max_size=200), size=st.integers(0, 2**40))
def test_header_parser_random_bytes(header: bytes, size: int) -> None:
    with contextlib.suppress(ckptpub.CkptpubError):
        parse_header(header, size, "fuzz.safetensors")


@settings(max_examples=400, deadline=None)
@given(
    tensors=st.dictionaries(st.text(max_size=4), tensor_entries | json_values, max_size=5),
    data_size=st.integers(0, 80),
)
def test_header_parser_structured(tensors: dict, data_size: int) -> None:
    header = json.dumps(tensors).encode()
    try:
        layout = parse_header(header, 8 + len(header) + data_size, "fuzz.safetensors")
    except ckptpub.CkptpubError:
        return
    position = 0  # whatever is accepted tiles the data region exactly
    for tensor in layout.tensors:
        assert tensor.begin == position
        position = tensor.end
    assert position == data_size


@settings(max_examples=300, deadline=None)
@given(document=json_values)
def test_manifest_parser_random_json(document: object) -> None:
    with contextlib.suppress(ckptpub.CkptpubError):
        parse_manifest(json.dumps(document).encode())


# -- manifests: valid ones built from random entries (the accept path), then damaged --------------

_NAME = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=6)
_PART = st.text("abcxyz019._-", min_size=1, max_size=5).filter(lambda p: p not in (".", ".."))
_HEX = st.text("0123456789abcdef", min_size=64, max_size=64).map("blake3:".__add__)
_WHOLE_BYTES = sorted(d for d, bits in DTYPE_BITS.items() if bits % 8 == 0)


@st.composite
def manifests(draw: st.DrawFn) -> Manifest:
    """A manifest that parses: sorted safe paths, shards whose tensors tile them, unique weight names
    (any text), the identity of its entries."""
    paths = sorted(set(draw(st.lists(st.lists(_PART, min_size=1, max_size=2).map("/".join), max_size=5))))
    names = iter(draw(st.lists(_NAME, unique=True, min_size=12, max_size=12)))
    files, tensors, shards = [], [], []
    for path in paths:
        if not draw(st.booleans()):
            files.append(FileRecord(path, draw(st.integers(0, 99)), draw(_HEX)))
            continue
        header_size, position = draw(st.integers(8, 64)), 0
        for _ in range(draw(st.integers(0, 2))):
            dtype = draw(st.sampled_from(_WHOLE_BYTES))
            shape = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
            end = position + prod(shape) * DTYPE_BITS[dtype] // 8
            tensors.append(TensorRecord(next(names), dtype, shape, path, (position, end), draw(_HEX)))
            position = end
        files.append(FileRecord(path, header_size + position, draw(_HEX), header_size))
        shards.append(path)
    weights = tuple(sorted(draw(st.sets(st.sampled_from(shards)))) if shards else ())
    config = draw(st.dictionaries(st.sampled_from(CONFIG_FILES), _HEX, max_size=2))
    provenance = draw(st.dictionaries(st.text(max_size=4), json_values.filter(_finite), max_size=2))
    record_files, record_tensors = tuple(files), tuple(tensors)
    identity = compute_identity(record_tensors, record_files, weights, config)
    return Manifest(identity, record_tensors, record_files, weights, config, provenance)


def _finite(value: object) -> bool:
    """JSON data canonical JSON can write (no infinity anywhere)."""
    try:
        canonical_json(value)
    except ValueError:
        return False
    return True


def _accepted_is_consistent(manifest: Manifest) -> None:
    """Whatever the parser accepts has the identity its own entries give, and encodes to what it reads."""
    try:
        tensors = manifest.tensors  # already checked on reading: this decodes nothing new
    except ckptpub.CkptpubError:
        return
    assert manifest.identity == compute_identity(tensors, manifest.files, manifest.weights, manifest.config)
    encoded = manifest.to_json()
    again = parse_manifest(
        encoded
    )  # encoding is a fixed point (provenance numbers as canonical JSON writes them)
    assert (again.identity, again.tensors, again.files, again.weights) == (
        manifest.identity,
        tensors,
        manifest.files,
        manifest.weights,
    )
    assert again.to_json() == encoded


@settings(max_examples=150, deadline=None)
@given(manifest=manifests())
def test_a_written_manifest_parses_back_to_itself(manifest: Manifest) -> None:
    """The accept path: every manifest the writer encodes is read back whole."""
    parsed = parse_manifest(manifest.to_json())
    assert (parsed.tensors, parsed.files) == (manifest.tensors, manifest.files)
    assert (parsed.weights, parsed.config) == (manifest.weights, manifest.config)
    assert canonical_json(parsed.provenance) == canonical_json(manifest.provenance)  # 1.0 is written 1
    assert parsed.identity == compute_identity(
        manifest.tensors, manifest.files, manifest.weights, manifest.config
    )


@settings(max_examples=300, deadline=None)
@given(manifest=manifests(), data=st.data())
def test_a_damaged_manifest_is_refused_or_consistent(manifest: Manifest, data: st.DataObject) -> None:
    """A field of the first line replaced or dropped, or bytes of a region edited, re-identified or
    not: CkptpubError or a consistent manifest (a change the identity does not cover, such as
    provenance), never another exception."""
    header, model, layout = v3_parts(manifest.to_json())
    if data.draw(st.booleans(), label="edit a region"):
        if data.draw(st.booleans(), label="the model region"):
            model = _edited(model, data)
        else:
            layout = _edited(layout, data)
    else:
        _damage_a_field(header, data)
    try:
        accepted = parse_manifest(_written(header, model, layout, data))
    except ckptpub.CkptpubError:
        return
    _accepted_is_consistent(accepted)


def _written(header: dict, model: bytes, layout: bytes, data: st.DataObject) -> bytes:
    """The damaged parts written back: the first line in canonical form, or re-identified as a careful
    forger would (``v3_forged``)."""
    if data.draw(st.booleans(), label="re-identify"):
        with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):  # no forger could
            return v3_forged(header, model, layout)
    with contextlib.suppress(ValueError):  # an infinity: not canonical JSON, so the line is plain JSON
        return v3_written(header, model, layout)
    return json.dumps(header).encode()


def _edited(region: bytes, data: st.DataObject) -> bytes:
    """``region`` with up to 3 bytes at one place replaced by a byte the encodings give meaning to."""
    at = data.draw(st.integers(0, len(region)), label="at")
    cut = data.draw(st.integers(0, 3), label="cut")
    edit = data.draw(st.sampled_from([b"", b"\t", b"\n", b"x", b"0", b",", b"\xff", b"]", b'"', b"\\"]))
    return region[:at] + edit + region[at + cut :]


def _damage_a_field(document: dict, data: st.DataObject) -> None:
    """Replace or drop one value anywhere in ``document``."""
    target, key = _some_place(document, data)
    if data.draw(st.booleans(), label="drop") and isinstance(target, dict):
        target.pop(key)
    else:
        target[key] = data.draw(json_values, label="value")


def _some_place(document: Any, data: st.DataObject) -> tuple[Any, Any]:
    """A container in ``document`` and a key or index of it, found by walking down from the top."""
    target: Any = document
    while True:
        keys = list(target) if isinstance(target, dict) else list(range(len(target)))
        key = data.draw(st.sampled_from(keys), label="key")
        child = target[key]
        if not (isinstance(child, (dict, list)) and child) or data.draw(st.booleans(), label="stop"):
            return target, key
        target = child


def _json_loads_verdict(data: bytes) -> tuple[str, object]:
    """What plain ``json.loads`` plus ckptpub's strictness rules say of ``data``: the value, or the error.

    An oracle independent of ``strict_json``'s hooks: the document is decoded with
    hooks that only note, in reading order, what the rules refuse (a duplicate key,
    NaN/Infinity, a number too large for a double); the first note is the error, as
    the first refusal stops the strict reader. A string holding a lone surrogate (an
    escape like ``\\ud800`` with no partner) is not text, and is refused too.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return ("error", "fuzz.json: document is not valid UTF-8")
    refusals: list[str] = []

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        keys = [key for key, _ in items]
        duplicates = [key for index, key in enumerate(keys) if key in keys[:index]]
        if duplicates:
            refusals.append(f"duplicate key {duplicates[0]!r}")
        return dict(items)

    def constant(name: str) -> float:
        refusals.append(f"{name} is not allowed")
        return 0.0

    def number(digits: str) -> float:
        if math.isinf(float(digits)):
            refusals.append(f"number {digits} is out of range")
        return float(digits)

    try:
        value = json.loads(text, object_pairs_hook=pairs, parse_constant=constant, parse_float=number)
    except (ValueError, RecursionError) as error:
        refusals.append(str(error).splitlines()[0])
    if refusals:
        return ("error", " ".join(f"fuzz.json: document is not valid JSON: {refusals[0]}".split()))
    try:
        json.dumps(value, ensure_ascii=False).encode(
            "utf-8"
        )  # UnicodeEncodeError: a lone surrogate somewhere
    except UnicodeEncodeError:
        return (
            "error",
            "fuzz.json: document holds a lone surrogate escape (\\ud800-\\udfff), not Unicode text",
        )
    return ("value", value)


def _mutations(text: str) -> st.SearchStrategy[str]:
    edits = st.sampled_from(
        ["", " ", "\n", "\ufeff", ",", "]", "}", "{", '"', "NaN", "1e999", "\x00", "\\", ":", '{"a":1,"a":2}']
    )
    return st.tuples(st.integers(0, len(text)), st.integers(0, 3), edits).map(
        lambda e: text[: e[0]] + e[2] + text[e[0] + e[1] :]
    )


@settings(max_examples=1500, deadline=None)
@given(data=st.data())
def test_strict_reader_agrees_with_json_loads(data: st.DataObject) -> None:
    """On any input loads_strict says what json.loads and the strictness rules say: value or error."""
    from ckptpub._format.strict_json import loads_strict

    document = data.draw(json_values)
    text = json.dumps(
        document, indent=data.draw(st.sampled_from([None, 1])), ensure_ascii=data.draw(st.booleans())
    )
    raw = (
        data.draw(_mutations(text)).encode("utf-8", "surrogatepass")
        if data.draw(st.booleans())
        else data.draw(st.binary(max_size=40))
    )
    expected = _json_loads_verdict(raw)
    try:
        actual: tuple[str, object] = ("value", loads_strict(raw, "fuzz.json", "document"))
    except ckptpub.CkptpubError as error:
        actual = ("error", str(error))
    if expected[0] == "value" and actual[0] == "value":
        assert json.dumps(actual[1], sort_keys=True) == json.dumps(expected[1], sort_keys=True)
    else:
        assert actual == expected


def test_a_dtype_that_is_not_a_string_is_refused_not_a_type_error() -> None:
    """Found by the structured fuzzing: a list or object as a dtype raised TypeError (unhashable) in both
    parsers, so publish, verify and show ended as 'internal error' instead of naming the tensor."""
    header = json.dumps({"w": {"dtype": [], "shape": [], "data_offsets": [0, 0]}}).encode()
    with pytest.raises(ckptpub.CkptpubError, match=r"^fuzz.safetensors: tensor 'w' has unknown dtype \[\]$"):
        parse_header(header, 8 + len(header), "fuzz.safetensors")
    zero = "blake3:" + "0" * 64
    shard = FileRecord("a.safetensors", 12, zero, 8)
    tensor = TensorRecord("w", "F32", (1,), shard.path, (0, 4), zero)
    written = Manifest("", (tensor,), (shard,), (shard.path,), {}, {}).to_json()
    first_line, model, layout = v3_parts(written)
    with pytest.raises(ckptpub.CkptpubError, match=r"model region: a name, dtype or digest is not a string"):
        parse_manifest(v3_forged(first_line, model.replace(b'"F32"', b"{}"), layout))
