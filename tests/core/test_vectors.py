"""Language-neutral test vectors (tests/vectors/*.json) that ckptpub writers and readers must reproduce.

Set CKPTPUB_UPDATE_VECTORS=1 to rewrite the expected values after a deliberate
format change (and bump the format version: old manifests must keep verifying).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file
from support.checkpoints import publish_in_format

import ckptpub
from ckptpub._format.canonical import canonical_json
from ckptpub._format.manifest import (
    FORMAT,
    FORMAT_V1,
    FORMAT_V2,
    TensorRecord,
    compute_identity,
    config_digest,
)

VECTORS = Path(__file__).parent.parent / "vectors"
UPDATE = os.environ.get("CKPTPUB_UPDATE_VECTORS") == "1"
NUMPY_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "U8": np.uint8,
    "BOOL": np.bool_,
    "I32": np.int32,
}


def load(name: str) -> dict:
    return json.loads((VECTORS / name).read_text())


def save(name: str, document: dict) -> None:
    (VECTORS / name).write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def test_canonical_json_vectors() -> None:
    document = load("canonical.json")
    for case in document["cases"]:
        assert canonical_json(json.loads(case["input"])).decode("utf-8") == case["canonical"], case["input"]


def test_number_vectors_from_rfc_8785() -> None:
    for case in load("canonical.json")["numbers"]:
        value = struct.unpack(">d", bytes.fromhex(case["ieee754"]))[0]
        assert canonical_json(value).decode("ascii") == case["canonical"], case


@given(st.floats(allow_nan=False, allow_infinity=False))
@settings(max_examples=2000, deadline=None)
def test_every_double_round_trips_with_its_shortest_digits(value: float) -> None:
    """The serialization parses back to the same double, with no more significant digits than ``repr``'s."""
    text = canonical_json(value).decode("ascii")
    assert float(text) == value
    mantissa = text.lstrip("-").partition("e")[0].replace(".", "").strip("0")
    assert len(mantissa) <= len(repr(abs(value)).partition("e")[0].replace(".", "").strip("0"))


def expected_for(case: dict) -> dict:
    tensors = tuple(
        TensorRecord(
            t["name"],
            t["dtype"],
            tuple(t["shape"]),
            "model.safetensors",
            (0, 0),
            ckptpub.tensor_digest(bytes.fromhex(t["data_hex"])),
        )
        for t in case["tensors"]
    )
    document = None if case["config_json"] is None else json.loads(case["config_json"])

    def identity(version: str) -> str:
        config = {} if document is None else {"config.json": config_digest(document, version)}
        return compute_identity(tensors, (), ("model.safetensors",), config, version)

    return {
        "tensor_digests": {t.name: t.digest for t in tensors},
        "config_digest": None if document is None else config_digest(document, FORMAT_V2),
        "config_digest_v3": None if document is None else config_digest(document, FORMAT),
        "identity": identity(FORMAT_V1),
        "identity_v2": identity(FORMAT_V2),
        "identity_v3": identity(FORMAT),
    }


def test_identity_vectors_from_entries() -> None:
    document = load("identity.json")
    if UPDATE:
        for case in document["cases"]:
            case["expected"] = expected_for(case)
        save("identity.json", document)
    for case in document["cases"]:
        assert expected_for(case) == case["expected"], case["description"]


def test_keys_ckptpub_3_leaves_out_change_only_the_older_identities() -> None:
    with_inert, without = load("identity.json")["cases"][-2:]
    assert with_inert["expected"]["identity_v3"] == without["expected"]["identity_v3"]
    assert with_inert["expected"]["identity_v2"] != without["expected"]["identity_v2"]
    assert with_inert["expected"]["identity"] != without["expected"]["identity"]


@pytest.mark.parametrize("shards", [1, 2])
def test_identity_vectors_from_real_files(tmp_path: Path, shards: int) -> None:
    for index, case in enumerate(load("identity.json")["cases"]):
        folder = tmp_path / f"case{index}"
        folder.mkdir()
        arrays = {
            t["name"]: np.frombuffer(bytes.fromhex(t["data_hex"]), dtype=NUMPY_DTYPES[t["dtype"]]).reshape(
                t["shape"]
            )
            for t in case["tensors"]
        }
        names = sorted(arrays)
        for shard in range(shards):
            save_file({n: arrays[n] for n in names[shard::shards]}, str(folder / f"w{shard}.safetensors"))
        if case["config_json"] is not None:
            (folder / "config.json").write_text(case["config_json"])
        manifest = ckptpub.build_manifest(folder)
        assert manifest.identity == case["expected"]["identity_v3"], case["description"]
        for version, key in ((FORMAT_V1, "identity"), (FORMAT_V2, "identity_v2")):
            assert publish_in_format(folder, version).identity == case["expected"][key], case["description"]
            (folder / "ckptpub.json").unlink()
