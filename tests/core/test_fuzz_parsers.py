"""Fuzzing the two parsers of untrusted bytes: nothing but CkptpubError may escape."""

from __future__ import annotations

import contextlib
import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

import ckptpub
from ckptpub._format.manifest import parse_manifest
from ckptpub._format.safetensors import parse_header

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


@settings(max_examples=300, deadline=None)
@given(
    files=st.lists(
        st.fixed_dictionaries(
            {
                "path": st.text(max_size=8),
                "size": st.integers(-1, 99),
                "digest": st.just("blake3:" + "a" * 64),
            }
        ),
        max_size=3,
    ),
    tensors=st.lists(json_values, max_size=3),
    weights=st.lists(st.text(max_size=5), max_size=2),
)
def test_manifest_parser_structured(files: list, tensors: list, weights: list) -> None:
    document = {
        "format": "ckptpub/1",
        "identity": "blake3:" + "0" * 64,
        "config": {},
        "weights": weights,
        "tensors": tensors,
        "files": files,
        "provenance": {},
    }
    with contextlib.suppress(ckptpub.CkptpubError):
        parse_manifest(json.dumps(document).encode())


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
