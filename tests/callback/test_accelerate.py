"""publish_accelerate_state in a plain accelerate loop on two processes (torchrun,
gloo, CPU): every process saves its part, the main process alone publishes once all
have, and the manifests verify."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from support.runs import free_port, run_group

from tests.callback.cbhelpers import assert_verifies, manifest_json

pytestmark = pytest.mark.slow  # two processes under accelerate

HERE = Path(__file__).resolve().parent


def test_accelerate_loop_two_processes(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        str(HERE / "accel_loop.py"),
        str(tmp_path),
    ]
    r = run_group(cmd, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    main = json.loads((tmp_path / "rank-0.json").read_text())
    other = json.loads((tmp_path / "rank-1.json").read_text())
    assert [x["step"] for x in main] == [4, 8, 12]
    assert all(x["identity"] for x in main)
    assert [x["identity"] for x in other] == [None, None, None]
    assert len({x["identity"] for x in main}) == 3

    folders = sorted((tmp_path / "checkpoints").iterdir())
    assert [f.name for f in folders] == ["checkpoint_1", "checkpoint_2"]  # total_limit=2 removed checkpoint_0
    for folder, rec in zip(folders, main[1:], strict=True):
        assert {"random_states_0.pkl", "random_states_1.pkl"} <= {p.name for p in folder.iterdir()}
        assert os.path.samefile(rec["folder"], folder)
        assert_verifies(folder)
        m = manifest_json(folder)
        assert m["identity"] == rec["identity"]
        assert m["provenance"]["step"] == rec["step"]
