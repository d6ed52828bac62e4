"""A folder published as ckptpub/2 verifies with its own identity; published again, it is the same model.

The folder and its manifest (tests/vectors/folder-v2.json) were written by the last
ckptpub that wrote ckptpub/2 (commit 45107bd), byte for byte; its config.json says
``"use_cache": false``, which a /2 identity counts and a /3 identity does not.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.checkpoints import publish_in_format, run_cli

import ckptpub
from ckptpub._format.manifest import FORMAT, FORMAT_V2

VECTOR = json.loads((Path(__file__).parent.parent / "vectors" / "folder-v2.json").read_text())
RECORDED = json.loads(VECTOR["manifest"].partition("\n")[0])["identity"]


@pytest.fixture
def v2_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "published-as-v2"
    folder.mkdir()
    for name, data in VECTOR["files_hex"].items():
        (folder / name).write_bytes(bytes.fromhex(data))
    (folder / "ckptpub.json").write_text(VECTOR["manifest"])
    return folder


def with_use_cache(source: Path, target: Path, value: bool) -> Path:
    """A copy of ``source``'s files (no manifest) whose config.json says ``use_cache: value``."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("ckptpub.json"))
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(config | {"use_cache": value}, indent=2))
    return target


def test_a_ckptpub_2_folder_still_verifies_with_the_identity_it_recorded(v2_folder: Path) -> None:
    result = run_cli("verify", v2_folder)
    assert result.returncode == 0, result.stderr
    assert f"identity {RECORDED}" in result.stderr
    assert json.loads(run_cli("show", v2_folder, "--json").stdout)["identity"] == RECORDED
    manifest = ckptpub.read_manifest(v2_folder)
    assert (manifest.version, manifest.identity) == (FORMAT_V2, RECORDED)


def test_its_use_cache_still_counts_in_its_format_and_not_in_the_new_one(
    v2_folder: Path, tmp_path: Path
) -> None:
    other = with_use_cache(v2_folder, tmp_path / "use-cache-true", True)
    assert publish_in_format(other, FORMAT_V2).identity != RECORDED
    republished = ckptpub.publish(with_use_cache(v2_folder, tmp_path / "use-cache-false", False))
    assert ckptpub.publish(other).identity == republished.identity != RECORDED


def test_published_again_in_the_new_format_it_is_the_same_model(v2_folder: Path, tmp_path: Path) -> None:
    exported = with_use_cache(v2_folder, tmp_path / "exported", True)  # save_pretrained writes use_cache true
    assert ckptpub.publish(exported).version == FORMAT
    result = run_cli("diff", v2_folder, exported)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"same model: ckptpub/2 identity {RECORDED}, ckptpub/3 identity blake3:")
    assert "config   config.json: use_cache false -> true (does not change the identity)" in lines
    document = json.loads(run_cli("diff", v2_folder, exported, "--json").stdout)
    assert document["same"] is True
    assert document["config_changed"] == []
    assert [(c["key"], c["changes_identity"]) for c in document["config_keys"]] == [("use_cache", False)]


def test_without_the_folders_two_formats_configs_cannot_be_compared(v2_folder: Path, tmp_path: Path) -> None:
    """Manifest files alone hold digests taken with two rules: not the same model, and the note says why."""
    exported = with_use_cache(v2_folder, tmp_path / "exported", False)
    ckptpub.publish(exported)
    copies = tmp_path / "a-ckptpub.json", tmp_path / "b-ckptpub.json"
    shutil.copy(v2_folder / "ckptpub.json", copies[0])
    shutil.copy(exported / "ckptpub.json", copies[1])
    result = run_cli("diff", *copies)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "config.json was digested by two formats' rules (ckptpub/2, ckptpub/3); keys not compared"
        in result.stdout
    )


def test_a_meaningful_key_beside_an_inert_one_changes_the_identity_and_says_which(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    for name, data in VECTOR["files_hex"].items():
        (base / name).write_bytes(bytes.fromhex(data))
    changed = with_use_cache(base, tmp_path / "changed", True)
    config = json.loads((changed / "config.json").read_text())
    (changed / "config.json").write_text(json.dumps(config | {"rms_norm_eps": 1e-05}))
    assert ckptpub.publish(base).identity != ckptpub.publish(changed).identity
    result = run_cli("diff", base, changed)
    assert result.returncode == 1
    assert "config   config.json: rms_norm_eps 0.000001 -> 0.00001" in result.stdout.splitlines()
    assert "config   config.json: use_cache false -> true (does not change the identity)" in result.stdout
