"""Fuzzing the two parsers of untrusted bytes: nothing but CkptpubError may escape."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

import ckptpub
from ckptpub.manifest import parse_manifest
from ckptpub.safetensors import parse_header

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
    try:
        parse_header(header, size, "fuzz.safetensors")
    except ckptpub.CkptpubError:
        pass


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
    try:
        parse_manifest(json.dumps(document).encode())
    except ckptpub.CkptpubError:
        pass


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
    try:
        parse_manifest(json.dumps(document).encode())
    except ckptpub.CkptpubError:
        pass


def _json_loads_verdict(data: bytes) -> tuple[str, object]:
    """What ``json.loads`` with ckptpub's strictness says of ``data``: the value, or the one-line error.

    Strictness beyond ``json.loads``: a string holding a lone surrogate (an escape
    like ``\\ud800`` with no partner) is not text, and is refused.
    """
    from ckptpub.strict_json import _finite_float, _reject_constant, _reject_duplicate_keys

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return ("error", "fuzz.json: document is not valid UTF-8")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_reject_duplicate_keys,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
        )
        json.dumps(value, ensure_ascii=False).encode(
            "utf-8"
        )  # UnicodeEncodeError: a lone surrogate somewhere
        return ("value", value)
    except UnicodeEncodeError:
        return (
            "error",
            "fuzz.json: document holds a lone surrogate escape (\\ud800-\\udfff), not Unicode text",
        )
    except (ValueError, RecursionError) as error:
        return (
            "error",
            " ".join(f"fuzz.json: document is not valid JSON: {str(error).splitlines()[0]}".split()),
        )


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
    """loads_strict calls json's C scanner directly; on any input it must say exactly what json.loads says."""
    from ckptpub.strict_json import loads_strict

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
