"""A real FSDP run (the Trainer's FSDP2 over two processes, gloo on CPU): one manifest per
checkpoint, hashed by both ranks, written by the saving rank only, listing every file the
two ranks wrote (the per-rank ``.distcp`` shards and optimizer shards of a sharded state
dict, which has no safetensors at its top), and it verifies. See fsdp_train.py for how
FSDP is kept on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.manifests import replaced
from support.runs import checkpoints, run_group, torchrun

import ckptpub
from ckptpub._filesystem import run_index

pytestmark = pytest.mark.slow  # FSDP Trainer runs under torchrun

HERE = Path(__file__).resolve().parent


def files_under(folder: Path) -> set[str]:
    """Every file below ``folder`` (dot files included), relative, except the manifest itself."""
    found = set()
    for root, _dirs, names in os.walk(folder):
        found |= {os.path.relpath(os.path.join(root, n), folder) for n in names}
    return found - {ckptpub.MANIFEST_NAME}


@pytest.mark.parametrize("state_dict_type", ["SHARDED_STATE_DICT", "FULL_STATE_DICT"])
def test_fsdp_run_publishes_every_file_once_per_checkpoint(tmp_path, state_dict_type):
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = torchrun(2, str(HERE / "fsdp_train.py"), str(tmp_path), state_dict_type)
    r = run_group(cmd, timeout=900, env=env)  # a bound for a loaded machine, not an expected time
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    writer, helper = (json.loads((tmp_path / f"rank-{i}.json").read_text()) for i in (0, 1))
    for rep in (writer, helper):  # FSDP really ran: not the DDP fallback accelerate takes on CPU
        assert rep["distributed_type"] == "FSDP", rep
        assert rep["model_class"].startswith("FSDP"), rep
    # the callback's hashing group was closed in step at train end: only the Trainer's own is left
    assert writer["process_groups"] == helper["process_groups"] == 1, (writer, helper)
    assert writer["world_size"] == 2
    assert writer["should_save"]
    assert not helper["should_save"]
    assert writer["published"] == [3, 6]
    assert writer["ranks"] == [2, 2]  # every checkpoint was hashed by both ranks
    assert writer["failures"] == []
    assert helper["published"] == []
    assert helper["failures"] == []

    names = checkpoints(tmp_path)
    assert names == ["checkpoint-3", "checkpoint-6"]
    for name in names:
        folder = tmp_path / name
        on_disk = files_under(folder)
        ours = [p.name for p in folder.iterdir() if "ckptpub" in p.name]
        assert ours == [ckptpub.MANIFEST_NAME], ours  # exactly one manifest, no stray temp file
        assert {"rng_state_0.pth", "rng_state_1.pth"} <= on_disk  # each rank wrote its own
        written = ckptpub.read_manifest(folder)
        assert {f.path for f in written.files} == on_disk  # every file of the checkpoint, none else
        if state_dict_type == "SHARDED_STATE_DICT":
            # rank 0's and rank 1's shards, the metadata DCP writes, and no weights at the top
            for sub in ("pytorch_model_fsdp_0", "optimizer_0"):
                assert {f"{sub}/__0_0.distcp", f"{sub}/__1_0.distcp", f"{sub}/.metadata"} <= on_disk
            assert not [p for p in on_disk if p.endswith(".safetensors")]
            assert written.tensors == ()  # identity covers every file (docs/format.md)
        else:
            assert {"model.safetensors", "pytorch_model_fsdp.bin", "optimizer.bin"} <= on_disk
            assert len(written.tensors) == 25  # the full model, gathered by rank 0
        cli = [sys.executable, "-m", "ckptpub", "verify", str(folder)]
        verified = subprocess.run(cli, capture_output=True, text=True, timeout=60)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        alone = ckptpub.build_manifest(folder, allow_no_weights=True, allow_nested=True)
        assert replaced(written, provenance={}) == replaced(
            alone, provenance={}
        )  # every entry and the tables
        assert written.identity == alone.identity
        assert written.provenance["step"] == int(name.rsplit("-", 1)[1])
    # one index line per checkpoint: the non-saving rank appended nothing
    assert [rec["path"] for rec in run_index.read(tmp_path)] == names
