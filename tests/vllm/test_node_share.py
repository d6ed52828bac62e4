"""Two ranks split the hashing of one checkpoint and agree on the outcome (``node_share``).

Real processes and real collectives: ``share_ranks.py`` under torchrun (gloo, the backend
of vLLM's ``cpu_group`` on CPU), the plugin's own ``StreamVerifier``; only vLLM's group
is replaced by torch's default group of the two ranks. One torchrun start runs every case.
The engine-level proof (a TP=2 vLLM engine) is in ``test_tensor_parallel.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.runs import torchrun

pytestmark = pytest.mark.slow  # ranks under torchrun

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def ranks(models, tmp_path_factory) -> dict[tuple[str, int], dict]:
    copy = shutil.copytree(models["v1"], tmp_path_factory.mktemp("copy") / "v1")
    command = torchrun(2, str(HERE / "share_ranks.py"), models["v1"], str(copy))
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [
        json.loads(line.split(" ", 1)[1])
        for line in done.stdout.splitlines()
        if line.startswith("CKPTPUB_RANK ")
    ]
    return {(line["case"], line["rank"]): line for line in lines}


def test_each_tensor_is_hashed_by_one_rank(ranks) -> None:
    zero, one = ranks["clean", 0], ranks["clean", 1]
    assert zero["of"] == one["of"] == 25
    assert zero["verified"] + one["verified"] == 25
    assert zero["verified"] > 0
    assert one["verified"] > 0
    assert not set(zero["mine"]) & set(one["mine"])


def test_every_rank_hands_on_its_own_copy_of_every_tensor(ranks) -> None:
    """Also the tensors another rank hashes: what a rank loads is never a view of the shard's memory."""
    assert ranks["clean", 0]["views"] == ranks["clean", 1]["views"] == 0
    assert ranks["listed", 0]["views"] == ranks["listed", 1]["views"] == 0


@pytest.mark.parametrize("hasher", [0, 1])
def test_a_changed_tensor_is_refused_by_every_rank_whichever_hashes_it(ranks, hasher: int) -> None:
    found, told = ranks[f"tamper{hasher}", hasher], ranks[f"tamper{hasher}", 1 - hasher]
    assert found["changed"] == told["changed"]
    assert f"tensor {found['changed']!r} differs from the manifest" in found["refused"]
    assert (
        f"rank {hasher} of the 2 loading this model refused: tensor {found['changed']!r} differs"
        in told["refused"]
    )


def test_ranks_reading_other_files_each_hash_everything(ranks) -> None:
    """Rank 1 reads a copy (other inodes): the digests of one cannot vouch for the other's bytes."""
    assert ranks["copy", 0]["verified"] == ranks["copy", 1]["verified"] == 25


def test_a_tensor_only_one_rank_sees_is_hashed_by_that_rank(ranks) -> None:
    """Expert parallel: rank 0 sees every other tensor; the rest can only be rank 1's."""
    zero, one = ranks["listed", 0], ranks["listed", 1]
    everything = sorted(set(zero["mine"]) | set(one["mine"]))
    assert len(everything) == 25
    assert zero["verified"] + one["verified"] == 25
    assert set(zero["mine"]) <= set(everything[::2])
