"""Two processes (``torchrun --nproc_per_node 2``, gloo on CPU): one manifest per
checkpoint, hashed by both ranks, written by the saving rank only: the manifest a
single process builds from the same folder, and it verifies."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support import tiny_model
from support.manifests import replaced
from support.runs import checkpoints, run_group, torchrun

import ckptpub
from ckptpub._filesystem import run_index
from tests.callback.cbhelpers import assert_verifies

pytestmark = pytest.mark.slow  # Trainer runs under torchrun

HERE = Path(__file__).resolve().parent


def test_two_process_run_publishes_once_per_checkpoint(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = torchrun(2, str(HERE / "ddp_train.py"), str(tmp_path))
    r = run_group(cmd, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    reports = {
        rep["rank"]: rep for rep in (json.loads((tmp_path / f"rank-{i}.json").read_text()) for i in (0, 1))
    }
    assert reports[0]["world_size"] == 2
    assert reports[0]["should_save"]
    assert not reports[1]["should_save"]
    assert reports[0]["published"] == [4, 8, 12]
    assert reports[0]["ranks"] == [2, 2, 2]  # every checkpoint was hashed by both ranks
    assert reports[0]["failures"] == []
    assert reports[1]["published"] == []
    assert reports[1]["failures"] == []

    names = checkpoints(tmp_path)
    assert names == ["checkpoint-4", "checkpoint-8", "checkpoint-12"]
    for name in names:
        folder = tmp_path / name
        ours = [
            p.name for p in folder.iterdir() if p.name.startswith("ckptpub") or p.name.startswith(".ckptpub")
        ]
        assert ours == [ckptpub.MANIFEST_NAME], ours  # exactly one manifest, no stray temp file
        assert {"rng_state_0.pth", "rng_state_1.pth"} <= {p.name for p in folder.iterdir()}
        assert_verifies(folder)
        written = ckptpub.read_manifest(folder)
        alone = ckptpub.build_manifest(folder, allow_no_weights=True, allow_nested=True)
        assert replaced(written, provenance={}) == replaced(
            alone, provenance={}
        )  # every entry and the tables
        assert written.identity == alone.identity
    # one index line per checkpoint: the non-saving rank appended nothing
    assert [rec["path"] for rec in run_index.read(tmp_path)] == names


def test_ranks_publish_an_unpublished_base_together_before_the_steps_that_record_it(tmp_path):
    """``publish_base=True`` on a base in the Hugging Face cache, loaded by hub id on both ranks."""
    from support.hf_cache import cache_model

    source = tmp_path / "download"
    tiny_model.build_model().save_pretrained(source)
    snapshot = cache_model(tmp_path / "hf", "acme/base", source)
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HOME=str(tmp_path / "hf"))
    run = tmp_path / "run"
    r = run_group(torchrun(2, str(HERE / "ddp_train.py"), str(run), "acme/base"), timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    writer, helper = (json.loads((run / f"rank-{i}.json").read_text()) for i in (0, 1))
    assert (writer["failures"], helper["failures"]) == ([], [])
    assert writer["ranks"] == [2, 2, 2]  # the base's hashing left the ranks in step for every save
    base = ckptpub.read_manifest(snapshot)
    assert base.identity == ckptpub.build_manifest(snapshot).identity
    for name in checkpoints(run):
        provenance = ckptpub.read_manifest(run / name).provenance
        assert provenance["base_identity"] == base.identity
        assert provenance["base_hub"] == {"repo_id": "acme/base", "revision": os.path.basename(snapshot)}


def test_a_stalled_rank_costs_one_checkpoint_its_manifest_and_never_hangs_training(tmp_path):
    """Rank 1 starts hashing 8 s late, the rank timeout is 3 s: the first save is not
    published (a warning, no manifest), later saves are hashed by rank 0 alone, training ends."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = torchrun(2, str(HERE / "ddp_stall_train.py"), str(tmp_path), "8", "3")
    r = run_group(cmd, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    writer, stalled = (json.loads((tmp_path / f"rank-{i}.json").read_text()) for i in (0, 1))
    assert writer["published"] == [8, 12]
    assert writer["ranks"] == [1, 1]  # after the failure the saving rank hashes alone
    (failure,) = writer["failures"]
    assert "step 4" in failure, failure
    assert "timed out" in failure.lower(), failure
    assert len(stalled["failures"]) == 1, stalled  # the late rank gave up too, once
    assert stalled["published"] == []
    assert not (tmp_path / "checkpoint-4" / ckptpub.MANIFEST_NAME).exists()
    assert [p.name for p in (tmp_path / "checkpoint-4").iterdir() if "ckptpub" in p.name] == []
    for name in ("checkpoint-8", "checkpoint-12"):
        assert_verifies(tmp_path / name)
    assert [rec["step"] for rec in run_index.read(tmp_path)] == [8, 12]
