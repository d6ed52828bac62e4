"""Identity: what must not change it, and what must."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.checkpoints import CONFIG, flip_byte, locate, model_tensors, write_checkpoint

import ckptpub


def identity(folder: Path) -> str:
    return ckptpub.publish(folder).identity


def test_copy_in_another_folder_keeps_identity(tmp_path: Path) -> None:
    original = write_checkpoint(tmp_path / "a" / "step-10")
    first = identity(original)
    copy = tmp_path / "elsewhere" / "renamed"
    shutil.copytree(original, copy)
    (copy / "ckptpub.json").unlink()
    assert identity(copy) == first


def test_resharding_and_metadata_keep_identity(tmp_path: Path) -> None:
    tensors = model_tensors()
    one = identity(write_checkpoint(tmp_path / "one", tensors, shards=1))
    three = identity(write_checkpoint(tmp_path / "three", tensors, shards=3))
    four = identity(
        write_checkpoint(tmp_path / "four", tensors, shards=4, metadata={"format": "pt", "note": "x"})
    )
    assert one == three == four


def test_config_formatting_and_volatile_keys_keep_identity(tmp_path: Path) -> None:
    base = identity(write_checkpoint(tmp_path / "base"))
    reformatted = write_checkpoint(tmp_path / "reformatted")
    config = dict(reversed(list(CONFIG.items())))
    config["rope_theta"] = 1e6  # 1000000.0 written another way
    config["transformers_version"] = "5.19.0"
    config["_name_or_path"] = "/some/where/else"
    (reformatted / "config.json").write_text(json.dumps(config, separators=(",", ":")))
    assert identity(reformatted) == base


def test_training_state_and_extra_files_do_not_enter_identity(tmp_path: Path) -> None:
    base = identity(write_checkpoint(tmp_path / "base"))
    other = write_checkpoint(tmp_path / "other")
    (other / "optimizer.pt").write_bytes(b"another optimizer state")
    (other / "trainer_state.json").write_text("{}")
    assert identity(other) == base


def test_one_deep_byte_changes_identity(tmp_path: Path) -> None:
    base_folder = write_checkpoint(tmp_path / "base", shards=2)
    base = identity(base_folder)
    changed = tmp_path / "changed"
    shutil.copytree(base_folder, changed)
    shard, begin, end = locate(changed, "model.embed_tokens.weight")
    header_before = shard.read_bytes()[: begin - 0][:100]
    flip_byte(shard, begin + 5000)  # past the tensor's first KiB, header untouched
    assert shard.read_bytes()[:100] == header_before
    assert identity(changed) != base


def test_config_meaning_changes_identity(tmp_path: Path) -> None:
    base = identity(write_checkpoint(tmp_path / "base"))
    other = write_checkpoint(tmp_path / "other", config=dict(CONFIG, rope_theta=10000.0))
    assert identity(other) != base


def test_dtype_or_shape_change_with_same_bytes_changes_identity(tmp_path: Path) -> None:
    tensors = model_tensors()
    base = identity(write_checkpoint(tmp_path / "base", tensors))
    reshaped = dict(
        tensors, **{"model.embed_tokens.weight": tensors["model.embed_tokens.weight"].reshape(64, 128)}
    )
    assert identity(write_checkpoint(tmp_path / "reshaped", reshaped)) != base
    retyped = dict(tensors, **{"model.norm.weight": tensors["model.norm.weight"].view(np.int32)})
    assert identity(write_checkpoint(tmp_path / "retyped", retyped)) != base


def test_renamed_tensor_changes_identity(tmp_path: Path) -> None:
    tensors = model_tensors()
    base = identity(write_checkpoint(tmp_path / "base", tensors))
    renamed = {("lm_head.weight" if k == "model.norm.weight" else k): v for k, v in tensors.items()}
    assert identity(write_checkpoint(tmp_path / "renamed", renamed)) != base


def test_folder_without_weights_uses_every_file(tmp_path: Path) -> None:
    folder = tmp_path / "fsdp"
    (folder / "pytorch_model_fsdp_0").mkdir(parents=True)
    (folder / "pytorch_model_fsdp_0" / "__0_0.distcp").write_bytes(b"\x01" * 4096)
    (folder / "config.json").write_text("{}")
    with pytest.raises(
        ckptpub.CkptpubError, match="has no weight files"
    ):  # probably the wrong folder, unless said so
        ckptpub.publish(folder)
    first = ckptpub.publish(folder, allow_no_weights=True)
    assert first.weights == ()
    assert first.tensors == ()
    (folder / "pytorch_model_fsdp_0" / "__0_0.distcp").write_bytes(b"\x02" * 4096)
    assert ckptpub.publish(folder, allow_no_weights=True).identity != first.identity
