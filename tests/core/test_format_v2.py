"""ckptpub/2: the whole-manifest vector, and every table rule refused with one error naming the manifest.

The vector (tests/vectors/manifest-v2.json) gives a folder's files byte for byte
and the exact header (less provenance), tables and identity a publisher must
write for it: another implementation can check its writer and reader against it.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from checkpoints import edit_model_table, run_cli, write_checkpoint

import ckptpub
from ckptpub._format.manifest import FORMAT, FORMAT_V1, parse_manifest

VECTORS = Path(__file__).parent.parent / "vectors"
UPDATE = os.environ.get("CKPTPUB_UPDATE_VECTORS") == "1"


def shard(tensors: dict[str, tuple[str, list[int], bytes]]) -> bytes:
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data


VECTOR_FILES = {
    "config.json": b'{"model_type": "tiny", "hidden_size": 4}',
    "model.safetensors": shard(
        {"w": ("F32", [2], bytes(range(8))), "b": ("BF16", [], b"\x80?"), "emb": ("U8", [1, 3], b"abc")}
    ),
    "extra/opt.safetensors": shard({"m": ("F16", [2], b"\x00<\x00<")}),
    "notes.txt": b"trained on tiny data\n",
}


def write_files(folder: Path, files: dict[str, bytes]) -> Path:
    for path, data in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
    return folder


def split(data: bytes) -> tuple[dict, bytes]:
    header, _, tables = data.partition(b"\n")
    return json.loads(header), tables


def test_manifest_vector(tmp_path: Path) -> None:
    folder = write_files(tmp_path, VECTOR_FILES)
    header, tables = split(ckptpub.build_manifest(folder).to_json())
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
    folder = write_files(tmp_path / "v", VECTOR_FILES)
    return ckptpub.build_manifest(folder).to_json()


def edit_model(change: Callable[[list[bytes]], list[bytes]]) -> Callable[[bytes], bytes]:
    def edit(data: bytes) -> bytes:
        return edit_model_table(data, change)

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
def test_broken_tables_are_refused_when_tensors_are_used(v2_bytes: bytes, damage, expected: str) -> None:
    manifest = parse_manifest(damage(v2_bytes), "m.json")  # the identity matches the (forged) tables
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


def test_tab_or_newline_in_a_name_is_refused_by_publish(tmp_path: Path) -> None:
    folder = write_files(tmp_path, {"model.safetensors": shard({"a\tb": ("U8", [1], b"x")})})
    result = run_cli("publish", folder)
    assert result.returncode == 2
    assert "holds a tab or newline" in result.stderr
    assert not (folder / "ckptpub.json").exists()


def test_v1_manifest_still_verifies_and_keeps_its_identity(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt")
    manifest = ckptpub.publish(folder)
    v1 = manifest.to_json(FORMAT_V1)
    (folder / "ckptpub.json").write_bytes(v1)
    reread = ckptpub.read_manifest(folder)
    assert reread.identity == json.loads(v1)["identity"] != manifest.identity
    assert reread.tensors == manifest.tensors
    result = run_cli("verify", folder)
    assert result.returncode == 0, result.stderr
    assert json.loads(v1)["format"] == FORMAT_V1
    assert split(manifest.to_json())[0]["format"] == FORMAT
