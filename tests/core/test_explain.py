"""``explain``: grouping tensor names by pattern, config keys read only from trustworthy files."""

from __future__ import annotations

import json
import os
from pathlib import Path

from checkpoints import write_checkpoint

import ckptpub
from ckptpub._operations.explain import group_tensors


def test_112_attention_projections_of_28_layers_are_one_group() -> None:
    names = [f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(28) for p in "qkvo"]
    (group,) = group_tensors("changed", [(n, "bytes") for n in names])
    assert (group.pattern, group.where, len(group.names)) == (
        "model.layers.*.self_attn.{k,o,q,v}_proj.weight",
        "in layers 0-27",
        112,
    )


def test_groups_split_by_what_changed_by_layer_set_and_by_module_family() -> None:
    items = [(f"model.layers.{i}.self_attn.q_proj.weight", "bytes") for i in (0, 1, 2, 3, 5, 7, 8, 9)]
    items += [
        (f"model.layers.{i}.self_attn.{p}_norm.weight", "bytes")
        for i in (0, 1, 2, 3, 5, 7, 8, 9)
        for p in "qk"
    ]
    items += [("model.embed_tokens.weight", "dtype BF16 -> F32"), ("lm_head.weight", "bytes")]
    groups = {(g.pattern, g.where, g.what) for g in group_tensors("changed", items)}
    assert groups == {
        ("model.layers.*.self_attn.q_proj.weight", "in layers 0-3,5,7-9", "bytes"),
        ("model.layers.*.self_attn.{k,q}_norm.weight", "in layers 0-3,5,7-9", "bytes"),
        ("model.embed_tokens.weight", "", "dtype BF16 -> F32"),
        ("lm_head.weight", "", "bytes"),
    }


def _published_pair(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, dtype in ((a, "bfloat16"), (b, "float32")):
        write_checkpoint(
            folder,
            extra_files=False,
            config={"model_type": "x", "dtype": dtype, "transformers_version": dtype},
        )
        ckptpub.publish(folder)
    return a, b


def test_config_keys_come_only_from_files_that_still_match_the_manifest(tmp_path: Path) -> None:
    a, b = _published_pair(tmp_path)
    diff = ckptpub.diff_manifests(ckptpub.read_manifest(a), ckptpub.read_manifest(b), folder_a=a, folder_b=b)
    assert [(c.key, c.old, c.new) for c in diff.config_keys] == [
        ("dtype", "bfloat16", "float32")
    ]  # volatile keys left out
    (b / "config.json").write_text(
        json.dumps({"model_type": "x", "dtype": "int8"})
    )  # edited after publishing
    diff = ckptpub.diff_manifests(ckptpub.read_manifest(a), ckptpub.read_manifest(b), folder_a=a, folder_b=b)
    assert diff.config_keys == ()
    assert diff.config_notes == (
        "config.json differs; keys not compared: b: config.json changed since ckptpub.json was written",
    )
    os.unlink(b / "config.json")
    os.symlink(a / "config.json", b / "config.json")  # never followed, even to another checkpoint
    diff = ckptpub.diff_manifests(ckptpub.read_manifest(a), ckptpub.read_manifest(b), folder_a=a, folder_b=b)
    assert diff.config_keys == ()
    assert "symlink" in diff.config_notes[0], diff.config_notes


def test_a_config_symlinked_inside_its_folder_is_read_as_publish_read_it(tmp_path: Path) -> None:
    """Publishing follows a symlink to a file inside the folder; so does diff (the one symlink rule)."""
    a, b = _published_pair(tmp_path)
    os.rename(b / "config.json", b / "config.real.json")
    os.symlink("config.real.json", b / "config.json")
    diff = ckptpub.diff_manifests(ckptpub.read_manifest(a), ckptpub.read_manifest(b), folder_a=a, folder_b=b)
    assert [(c.key, c.old, c.new) for c in diff.config_keys] == [("dtype", "bfloat16", "float32")]


def test_a_pattern_stays_one_line_however_many_names_it_covers() -> None:
    (flat,) = group_tensors("added", [(f"t{i}_w", "F32") for i in range(20000)])
    assert flat.pattern == "t{0-19999}_w"
    assert len(flat.names) == 20000
    words = [f"{a}{b}" for a in "abcdefghij" for b in "xyz"]
    (many,) = group_tensors("removed", [(f"head.{w}_proj", "F16") for w in words])
    assert many.pattern == "head.{ax,ay,az,... 27 more}_proj"
    assert len(many.names) == 30
    (nested,) = group_tensors(
        "changed", [(f"block.{i}.sub.{j}.w", "bytes") for i in range(4) for j in range(12)]
    )
    assert (nested.pattern, nested.where) == ("block.*.sub.{0-11}.w", "in block 0-3")
