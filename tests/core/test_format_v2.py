"""ckptpub/2 (read, no longer written): the whole-manifest vector, and every table rule refused.

The vector (tests/vectors/manifest-v2.json) gives a folder's files byte for byte
and the exact header (less provenance), tables and identity the ckptpub/2 writer
wrote for it: readers must keep reading such manifests with the identity they record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from support.checkpoints import (
    VECTOR_FILES,
    forged_tables,
    publish_in_format,
    raw_shard,
    run_cli,
    write_checkpoint,
    write_files,
)

import ckptpub
from ckptpub._format.manifest import FORMAT, FORMAT_V1, FORMAT_V2, parse_manifest

VECTORS = Path(__file__).parent.parent / "vectors"
UPDATE = os.environ.get("CKPTPUB_UPDATE_VECTORS") == "1"


def split(data: bytes) -> tuple[dict, bytes]:
    header, _, tables = data.partition(b"\n")
    return json.loads(header), tables


def v2_manifest(folder: Path) -> bytes:
    publish_in_format(folder, FORMAT_V2)
    return (folder / "ckptpub.json").read_bytes()


def test_manifest_vector(tmp_path: Path) -> None:
    folder = write_files(tmp_path, VECTOR_FILES)
    header, tables = split(v2_manifest(folder))
    header.pop("provenance")
    model_size = header["tables"]["model"]
    produced = {
        "header_less_provenance": header,
        "model_table": tables[:model_size].decode(),
        "layout_table": tables[model_size:].decode(),
    }
    path = VECTORS / "manifest-v2.json"
    if UPDATE:
        files = {name: data.hex() for name, data in VECTOR_FILES.items()}
        path.write_text(json.dumps({"files_hex": files, "expected": produced}, indent=2) + "\n")
    vector = json.loads(path.read_text())
    assert {name: bytes.fromhex(h) for name, h in vector["files_hex"].items()} == VECTOR_FILES
    assert produced == vector["expected"]
    expected = vector["expected"]
    written = (
        json.dumps(expected["header_less_provenance"] | {"provenance": {}}).encode()
        + b"\n"
        + (expected["model_table"] + expected["layout_table"]).encode()
    )
    manifest = parse_manifest(written)
    assert manifest.identity == expected["header_less_provenance"]["identity"]
    assert [(t.name, t.file, t.data_offsets) for t in manifest.tensors] == [
        ("m", "extra/opt.safetensors", (0, 4)),
        ("w", "model.safetensors", (0, 8)),
        ("b", "model.safetensors", (8, 10)),
        ("emb", "model.safetensors", (10, 13)),
    ]


@pytest.fixture
def v2_bytes(tmp_path: Path) -> bytes:
    return v2_manifest(write_files(tmp_path / "v", VECTOR_FILES))


def edit_model(change: Callable[[list[bytes]], list[bytes]]) -> Callable[[bytes], bytes]:
    def edit(data: bytes) -> bytes:
        return forged_tables(
            data, lambda model, layout: (b"".join(change(model.splitlines(keepends=True))), layout)
        )

    return edit


TABLE_CASES = [
    ("unsorted model table", edit_model(lambda lines: lines[::-1]), "not sorted and unique"),
    ("duplicate name", edit_model(lambda lines: [lines[0], lines[0], *lines[2:]]), "not sorted and unique"),
    (
        "uppercase digest",
        edit_model(lambda lines: [lines[0].upper(), *lines[1:]]),
        "unknown dtype|64 lowercase hex",
    ),
    (
        "five fields",
        edit_model(lambda lines: [lines[0][:-1] + b"\tx\n", *lines[1:]]),
        "name, dtype, shape and digest",
    ),
    (
        "shape with a leading zero",
        edit_model(lambda lines: [x.replace(b"\t1,3\t", b"\t01,3\t") for x in lines]),
        "non-negative integers",
    ),
    (
        "dtype of another width",
        edit_model(lambda lines: [lines[0].replace(b"\tBF16\t", b"\tF32\t"), *lines[1:]]),
        "do not add up",
    ),
    ("not UTF-8", edit_model(lambda lines: [b"\xff" + lines[0], *lines[1:]]), "not valid UTF-8"),
]


@pytest.mark.parametrize(
    ("damage", "expected"), [c[1:] for c in TABLE_CASES], ids=[c[0] for c in TABLE_CASES]
)
def test_broken_tables_are_refused(v2_bytes: bytes, damage, expected: str) -> None:
    """On reading (the identity matches the forged tables); a reader of the identity alone
    (``check_tables=False``) is refused when it first uses the tensors."""
    with pytest.raises(ckptpub.CkptpubError, match=f"^m.json: .*({expected})"):
        parse_manifest(damage(v2_bytes), "m.json")
    manifest = parse_manifest(damage(v2_bytes), "m.json", check_tables=False)
    with pytest.raises(ckptpub.CkptpubError, match=f"^m.json: .*({expected})"):
        manifest.tensors  # noqa: B018 - decoding is the check


def test_edited_table_without_new_identity_is_refused_on_read(v2_bytes: bytes) -> None:
    header, tables = split(v2_bytes)
    flipped = tables.replace(b"\tU8\t", b"\tI8\t", 1)
    with pytest.raises(ckptpub.CkptpubError, match="does not match the manifest's own entries"):
        parse_manifest(json.dumps(header).encode() + b"\n" + flipped)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d[:-1], "tables hold"),
        (lambda d: d + b"x", "tables hold"),
        (lambda d: d.replace(b'"tensors":3', b'"tensors":2', 1), "line counts"),
        (
            lambda d: d.replace(
                b'"files":[', b'"files":[{"path":"zz","size":0,"digest":"blake3:' + b"0" * 64 + b'"},', 1
            ),
            "not sorted",
        ),
        (lambda d: d.replace(b'"weights":["model.safetensors"]', b'"weights":["notes.txt"]', 1), "weights"),
    ],
)
def test_header_rules(v2_bytes: bytes, edit: Callable[[bytes], bytes], expected: str) -> None:
    with pytest.raises(ckptpub.CkptpubError, match=expected):
        parse_manifest(edit(v2_bytes))


def test_a_tab_or_newline_in_a_name_cannot_be_written_as_v2_but_is_published_as_v3(tmp_path: Path) -> None:
    folder = write_files(
        tmp_path, {"model.safetensors": raw_shard({"a\tb": ("U8", [1], b"x"), "c\nd": ("U8", [1], b"y")})}
    )
    with pytest.raises(ckptpub.CkptpubError, match="holds a tab or newline"):
        publish_in_format(folder, FORMAT_V2)
    result = run_cli("publish", folder)
    assert result.returncode == 0, result.stderr
    assert [t.name for t in ckptpub.read_manifest(folder).tensors] == ["a\tb", "c\nd"]
    assert json.loads((folder / "ckptpub.json").read_bytes())["model"][0][0] == "a\tb"


@pytest.mark.parametrize("version", [FORMAT_V1, FORMAT_V2])
def test_an_old_format_manifest_still_verifies_and_keeps_its_identity(tmp_path: Path, version: str) -> None:
    folder = write_checkpoint(tmp_path / "ckpt")
    current = ckptpub.build_manifest(folder)
    old = publish_in_format(folder, version)
    reread = ckptpub.read_manifest(folder)
    assert reread.version == version
    assert reread.identity == split((folder / "ckptpub.json").read_bytes())[0]["identity"]
    assert reread.identity != current.identity
    assert reread.tensors == current.tensors == old.tensors
    result = run_cli("verify", folder)
    assert result.returncode == 0, result.stderr
    assert f"identity {reread.identity}" in result.stderr
    assert json.loads(ckptpub.publish(folder).to_json())["format"] == FORMAT


def test_a_manifest_that_cannot_be_encoded_is_a_ckptpub_error(tmp_path: Path) -> None:
    """``to_json`` follows the error model: an unknown format, a config rule the format does not
    follow, or provenance that is not JSON data."""
    folder = write_checkpoint(tmp_path / "ckpt")
    manifest = ckptpub.build_manifest(folder)
    with pytest.raises(ckptpub.CkptpubError, match="no encoding for manifest format 'ckptpub/9'"):
        manifest.to_json("ckptpub/9")
    with pytest.raises(ckptpub.CkptpubError, match="cannot be written as ckptpub/3"):
        publish_in_format(folder, FORMAT_V2).to_json(FORMAT)
    for version in (FORMAT, FORMAT_V2, FORMAT_V1):
        by_hand = ckptpub.Manifest(
            manifest.identity,
            manifest.tensors,
            manifest.files,
            manifest.weights,
            manifest.config,
            {"x": float("inf")},
            version,
        )
        with pytest.raises(ckptpub.CkptpubError, match=f"cannot be encoded as {version}: .*Infinity"):
            by_hand.to_json(version)
