"""ckptpub/3: one JSON document in one exact byte layout; every tool reads it, every rule is checked.

The vector (tests/vectors/manifest-v3.json) gives a folder's files byte for byte and
the exact manifest (with empty provenance) a publisher must write for it. The header
line is rebuilt by tests/checkpoints.py's ``v3_forged`` from docs/format.md's rule, not
from ckptpub's encoder, so a forger's manifest (regions edited, sizes and identity
recomputed) is what a careful attacker would write.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.checkpoints import (
    V3_HEADER_ORDER,
    VECTOR_FILES,
    raw_shard,
    run_cli,
    v3_forged,
    v3_parts,
    write_checkpoint,
    write_files,
)
from support.manifests import replaced

import ckptpub
from ckptpub._format.canonical import canonical_json
from ckptpub._format.manifest import parse_manifest
from ckptpub._format.regions import region_text

VECTORS = Path(__file__).parent.parent / "vectors"
UPDATE = os.environ.get("CKPTPUB_UPDATE_VECTORS") == "1"


def vector_manifest(folder: Path) -> bytes:
    return replaced(ckptpub.build_manifest(folder), provenance={}).to_json()


def test_manifest_vector(tmp_path: Path) -> None:
    folder = write_files(tmp_path, VECTOR_FILES)
    produced = vector_manifest(folder).decode()
    path = VECTORS / "manifest-v3.json"
    if UPDATE:
        files = {name: data.hex() for name, data in VECTOR_FILES.items()}
        path.write_text(json.dumps({"files_hex": files, "manifest": produced}, indent=2) + "\n")
    vector = json.loads(path.read_text())
    assert {name: bytes.fromhex(h) for name, h in vector["files_hex"].items()} == VECTOR_FILES
    assert produced == vector["manifest"]
    manifest = parse_manifest(vector["manifest"].encode())
    document = json.loads(vector["manifest"])
    assert manifest.identity == document["identity"]
    assert [entry[:3] for entry in document["model"]] == [
        ["b", "BF16", []],
        ["emb", "U8", [1, 3]],
        ["w", "F32", [2]],
    ]
    assert [entry[:3] for entry in document["layout"]] == [["m", "F16", [2]], ["w"], ["b"], ["emb"]]
    assert [(t.name, t.file, t.data_offsets) for t in manifest.tensors] == [
        ("m", "extra/opt.safetensors", (0, 4)),
        ("w", "model.safetensors", (0, 8)),
        ("b", "model.safetensors", (8, 10)),
        ("emb", "model.safetensors", (10, 13)),
    ]


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_checkpoint(tmp_path_factory.mktemp("v3") / "ckpt", shards=2)
    result = run_cli("publish", folder)
    assert result.returncode == 0, result.stderr
    return folder


def test_json_load_and_jq_read_a_fresh_manifest_with_the_identity_show_prints(published: Path) -> None:
    path = published / "ckptpub.json"
    with path.open("rb") as handle:
        document = json.load(handle)
    show = json.loads(run_cli("show", published, "--json").stdout)
    jq = subprocess.run(["jq", "-r", ".identity", str(path)], capture_output=True, text=True, check=True)
    assert document["format"] == "ckptpub/3"
    assert document["identity"] == show["identity"] == jq.stdout.strip()
    count = subprocess.run(["jq", ".model | length", str(path)], capture_output=True, text=True, check=True)
    assert int(count.stdout) == show["tensors"] == len(document["model"])
    names = [entry[0] for entry in document["model"]]
    assert names == sorted(names) == sorted(t.name for t in ckptpub.read_manifest(published).tensors)


@pytest.fixture
def v3_bytes(tmp_path: Path) -> bytes:
    return vector_manifest(write_files(tmp_path / "v", VECTOR_FILES))


def test_the_forger_in_this_file_writes_what_publish_writes(v3_bytes: bytes) -> None:
    assert v3_forged(*v3_parts(v3_bytes)) == v3_bytes


def model_entries(change: Callable[[list[bytes]], list[bytes]]) -> Callable[[bytes], bytes]:
    """Edit the model region's entries (their texts, without the ``,\\n`` between them), then re-identify."""

    def edit(data: bytes) -> bytes:
        header, model, layout = v3_parts(data)
        return v3_forged(header, b",\n".join(change(model.split(b",\n"))), layout)

    return edit


def layout_text(old: bytes, new: bytes) -> Callable[[bytes], bytes]:
    def edit(data: bytes) -> bytes:
        header, model, layout = v3_parts(data)
        assert old in layout
        return v3_forged(header, model, layout.replace(old, new, 1))

    return edit


REGION_CASES = [
    ("unsorted model region", model_entries(lambda x: [x[1], x[0], *x[2:]]), "not sorted and unique"),
    ("duplicate name", model_entries(lambda x: [x[0], x[0], *x[2:]]), "not sorted and unique"),
    (
        "a space inside an entry",
        model_entries(lambda x: [x[0].replace(b",", b", ", 1), *x[1:]]),
        "canonical form",
    ),
    (
        "a line break moved into an entry",
        model_entries(lambda x: [x[0] + b"," + x[1].replace(b",", b",\n", 1), *x[2:]]),
        "canonical form",
    ),
    (
        "uppercase digest",
        model_entries(lambda x: [x[0][:-10] + x[0][-10:].upper(), *x[1:]]),
        "64 lowercase hex",
    ),
    ("short digest", model_entries(lambda x: [x[0][:-3] + b'"]', *x[1:]]), "64 lowercase hex"),
    ("a fifth field", model_entries(lambda x: [x[0][:-1] + b",1]", *x[1:]]), "not \\[name, dtype"),
    (
        "a float dimension",
        model_entries(lambda x: [*x[:1], x[1].replace(b"[1,3]", b"[1.0,3]"), *x[2:]]),
        "shape",
    ),
    (
        "a negative dimension",
        model_entries(lambda x: [*x[:1], x[1].replace(b"[1,3]", b"[-1,3]"), *x[2:]]),
        "shape",
    ),
    (
        "a true dimension",
        model_entries(lambda x: [*x[:1], x[1].replace(b"[1,3]", b"[true,3]"), *x[2:]]),
        "shape",
    ),
    (
        "a dimension of 2**53",
        model_entries(lambda x: [*x[:1], x[1].replace(b"[1,3]", b"[0,%d]" % 2**53), *x[2:]]),
        "2\\*\\*53",
    ),
    ("unknown dtype", model_entries(lambda x: [x[0].replace(b'"BF16"', b'"BF17"'), *x[1:]]), "unknown dtype"),
    ("an entry that is a string", model_entries(lambda x: [b'"b"', *x[1:]]), "not an array"),
    (
        "dtype of another width",
        model_entries(lambda x: [x[0].replace(b'"BF16"', b'"F32"'), *x[1:]]),
        "do not add up",
    ),
    ("not JSON", model_entries(lambda x: [x[0].replace(b"[", b"{", 1), *x[1:]]), "not valid JSON"),
    ("not UTF-8", model_entries(lambda x: [x[0].replace(b'"b"', b'"\xff"'), *x[1:]]), "not valid UTF-8"),
    (
        "weight entry with fields",
        layout_text(b'["w"]', b'["w","F32",[2],"' + b"0" * 64 + b'"]'),
        "not \\[name\\]",
    ),
    ("weight entry not in the model", layout_text(b'["w"]', b'["x"]'), "not the name of a model tensor"),
    ("weight entry listed twice", layout_text(b'["emb"]', b'["w"]'), "a tensor name occurs twice"),
    ("two entries on a line", model_entries(lambda x: [x[0] + b"," + x[1], *x[2:]]), "canonical form"),
    ("a tensor count off by one", lambda d: d.replace(b'"tensors":3', b'"tensors":2', 1), "tensor counts"),
]


@pytest.mark.parametrize(
    ("damage", "expected"), [c[1:] for c in REGION_CASES], ids=[c[0] for c in REGION_CASES]
)
def test_broken_regions_are_refused(v3_bytes: bytes, damage, expected: str) -> None:
    """On reading (the identity matches the forged regions); a reader of the identity alone
    (``check_tables=False``: an engine's key) is refused when it first uses the entries."""
    with pytest.raises(ckptpub.CkptpubError, match=f"^m.json: .*({expected})"):
        parse_manifest(damage(v3_bytes), "m.json")
    manifest = parse_manifest(damage(v3_bytes), "m.json", check_tables=False)
    with pytest.raises(ckptpub.CkptpubError, match=f"^m.json: .*({expected})"):
        manifest.tensors  # noqa: B018 - decoding is the check


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d[:-1], "regions do not have the sizes"),
        (lambda d: d + b"\n", "regions do not have the sizes"),
        (lambda d: d.replace(b'],"layout":[', b'], "layout":[', 1), "regions do not have the sizes"),
        (lambda d: d.replace(b'"sizes":', b'"sizes" :', 1), "not in canonical form"),
        (lambda d: d.replace(b',"sizes":{', b',"sizes":{}, "x":{', 1), "not valid JSON|unexpected"),
        (lambda d: d.replace(b'"model":[\n', b'"model": [\n', 1), "first line must end with"),
        (lambda d: d.replace(b'"tensors":1', b'"tensors":1.0', 1), "tensors"),
        (lambda d: json.dumps(json.loads(d), indent=2).encode(), "must be in its exact layout"),
        (lambda d: json.dumps(json.loads(d), separators=(",", ":")).encode(), "first line must end with"),
    ],
    ids=[
        "truncated",
        "trailing newline",
        "glue",
        "space in header",
        "extra field",
        "first line",
        "float count",
        "pretty-printed",
        "one line",
    ],
)
def test_layout_rules(v3_bytes: bytes, edit: Callable[[bytes], bytes], expected: str) -> None:
    with pytest.raises(ckptpub.CkptpubError, match=expected):
        parse_manifest(edit(v3_bytes))


def test_a_header_with_its_fields_in_another_order_is_refused(v3_bytes: bytes) -> None:
    header, model, layout = v3_parts(v3_bytes)
    line = b"{" + b",".join(
        b'"%s":%s' % (k.encode(), canonical_json(header[k])) for k in reversed(V3_HEADER_ORDER)
    )
    data = line + b',"model":[\n' + model + b'\n],"layout":[\n' + layout + b"\n]}\n"
    with pytest.raises(ckptpub.CkptpubError, match="must be in its exact layout"):
        parse_manifest(data)
    moved = b'{"format":"ckptpub/3",' + data[1:].replace(b',"format":"ckptpub/3"', b"", 1)
    with pytest.raises(ckptpub.CkptpubError, match="not in canonical form"):
        parse_manifest(moved)


def test_an_edited_region_without_a_new_identity_is_refused_on_read(v3_bytes: bytes) -> None:
    with pytest.raises(ckptpub.CkptpubError, match="does not match the manifest's own entries"):
        parse_manifest(v3_bytes.replace(b'"U8"', b'"I8"', 1))


def test_names_json_escapes_are_published_and_read_back(tmp_path: Path) -> None:
    """Tab, newline, quote, backslash, ``],[`` (the line-break marker), a control character, non-ASCII."""
    names = ["a\tb", "c\nd", 'q"uote', "back\\slash", "x],[y", "bell\x07", "é✓", "\u2028"]
    tensors = {name: ("U8", [1], bytes([i])) for i, name in enumerate(names)}
    folder = write_files(tmp_path, {"model.safetensors": raw_shard(tensors), "config.json": b"{}"})
    manifest = ckptpub.publish(folder)
    document = json.loads((folder / "ckptpub.json").read_bytes())
    assert [entry[0] for entry in document["model"]] == sorted(names)
    reread = ckptpub.read_manifest(folder)
    assert reread.identity == manifest.identity
    assert reread.tensors == manifest.tensors
    assert ckptpub.verify(folder).ok


entry_names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=8)
entries = st.lists(
    st.tuples(
        entry_names,
        st.sampled_from(["F32", "BF16", "U8"]),
        st.lists(st.integers(0, 2**53 - 1), max_size=3),
        st.text("0123456789abcdef", min_size=64, max_size=64),
    ).map(list),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(entries=entries)
def test_region_text_is_each_entry_canonical_json_one_a_line(entries: list) -> None:
    expected = ",\n".join(canonical_json(entry).decode() for entry in entries)
    assert region_text(entries) == expected
    assert json.loads("[" + expected + "]") == entries


def _outcome(decode: Callable[[], object]) -> object:
    try:
        return decode()
    except ckptpub.CkptpubError:
        return "refused"


@settings(max_examples=400, deadline=None)
@given(entries=entries, data=st.data())
def test_the_quick_reader_and_the_json_reader_agree(entries: list, data: st.DataObject) -> None:
    """Splitting at quotes (no backslash in the region) accepts exactly what decoding the JSON accepts."""
    from ckptpub._format.records import failure_in, model_entries
    from ckptpub._format.regions import _model_columns, decode_model

    by_name = {entry[0]: entry for entry in entries}
    region = region_text(sorted(by_name.values())).encode()
    region = data.draw(st.one_of(st.just(region), _mutations(region)))
    json_only = _outcome(lambda: model_entries(_model_columns(region, "m", failure_in("m"), quoted=False)))
    assert _outcome(lambda: decode_model(region, "m")) == json_only


def _mutations(data: bytes) -> st.SearchStrategy[bytes]:
    edits = st.sampled_from([b"", b" ", b"\n", b",", b"]", b"[", b'"', b"1", b"\\", b"\xff", b"],[", b"e9"])
    return st.tuples(st.integers(0, len(data)), st.integers(0, 3), edits).map(
        lambda e: data[: e[0]] + e[2] + data[e[0] + e[1] :]
    )


@settings(max_examples=500, deadline=None)
@given(data=st.data())
def test_nothing_but_ckptpub_error_escapes_from_a_damaged_manifest(data: st.DataObject) -> None:
    """Random edits of a valid manifest, re-identified or not: read, decoded, or refused as a CkptpubError."""
    valid = json.loads((VECTORS / "manifest-v3.json").read_text())["manifest"].encode()
    damaged = data.draw(_mutations(valid))
    if data.draw(st.booleans()):
        with contextlib.suppress(ValueError, KeyError, TypeError):  # a first line no forger could use
            damaged = v3_forged(*v3_parts(damaged))
    with contextlib.suppress(ckptpub.CkptpubError):
        manifest = parse_manifest(damaged)
        manifest.model()
        manifest.tensors  # noqa: B018 - decoding is the check
