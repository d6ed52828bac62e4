"""``explain``: grouping tensor names by pattern, config keys read only from trustworthy files."""

from __future__ import annotations

import json
import os
from math import prod
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from support.checkpoints import write_checkpoint

import ckptpub
from ckptpub._format.manifest import FileRecord, Manifest, TensorRecord, compute_identity
from ckptpub._format.safetensors import DTYPE_BITS
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


_NAMES = st.sampled_from([f"t{i}" for i in range(8)])
#: A tensor's dtype, shape, and a letter standing for its bytes (its digest is the letter 64 times).
_ENTRY = st.tuples(
    st.sampled_from(["F32", "BF16"]), st.sampled_from([(2,), (1, 2), (4,)]), st.sampled_from("abc")
)


@settings(max_examples=200, deadline=None)
@given(
    before=st.dictionaries(_NAMES, _ENTRY, min_size=1),
    after=st.dictionaries(_NAMES, _ENTRY, min_size=1),
    same_names=st.booleans(),
)
def test_diff_names_every_changed_added_and_removed_tensor(
    before: dict, after: dict, same_names: bool
) -> None:
    """Manifests with the same tensor names are compared column by column, others by name: one answer."""
    if same_names:  # the common case of two steps of one run: every name on both sides
        after = {name: after.get(name, entry) for name, entry in before.items()}
    a, b = _manifest(before), _manifest(after)
    difference = ckptpub.diff_manifests(a, b)
    model_a, model_b = a.model(), b.model()
    changed = sorted(n for n in model_a.keys() & model_b.keys() if model_a[n] != model_b[n])
    assert difference.changed == tuple(changed)
    assert difference.added == tuple(sorted(model_b.keys() - model_a.keys()))
    assert difference.removed == tuple(sorted(model_a.keys() - model_b.keys()))
    assert [change.name for change in difference.tensor_changes] == list(difference.changed)


def _manifest(entries: dict[str, tuple[str, tuple[int, ...], str]]) -> Manifest:
    """A one-shard manifest of these tensors (name: dtype, shape, a letter standing for its bytes)."""
    tensors, position = [], 0
    for name, (dtype, shape, letter) in sorted(entries.items()):
        end = position + prod(shape) * DTYPE_BITS[dtype] // 8
        digest = "blake3:" + letter * 64
        tensors.append(TensorRecord(name, dtype, shape, "w.safetensors", (position, end), digest))
        position = end
    files = (FileRecord("w.safetensors", 8 + position, "blake3:" + "0" * 64, 8),)
    identity = compute_identity(tuple(tensors), files, ("w.safetensors",), {})
    return Manifest(identity, tuple(tensors), files, ("w.safetensors",), {}, {})
