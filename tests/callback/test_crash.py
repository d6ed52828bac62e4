"""Crash safety: a training process SIGKILLed at random points while it publishes
leaves every checkpoint folder with no manifest or a complete one that verifies, and
a run index whose lines are whole and match the manifests they name.

Kills are aimed at the publishing window: a random number of completed saves
(trainer_state.json present), then a random delay of 0-120 ms (a publish of this
~50 MB checkpoint takes tens of ms here). Each trial is bounded in time.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptpub import MANIFEST_NAME
from ckptpub._filesystem import run_index
from tests.callback.cbhelpers import assert_verifies, manifest_json

pytestmark = pytest.mark.slow  # a Trainer run in a subprocess, killed while it publishes

HERE = Path(__file__).resolve().parent
TRIALS = int(os.environ.get("CKPTPUB_CRASH_TRIALS", "8"))


def completed_saves(out: Path) -> int:
    try:
        return sum(
            1
            for e in os.scandir(out)
            if e.name.startswith("checkpoint-") and os.path.exists(os.path.join(e.path, "trainer_state.json"))
        )
    except FileNotFoundError:
        return 0


def test_sigkill_while_publishing_never_leaves_a_bad_manifest(tmp_path):
    rng = random.Random(int(os.environ.get("CKPTPUB_CRASH_SEED", "1234")))
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    stats = {"folders": 0, "with_manifest": 0, "without": 0, "temp_left": 0}
    for trial in range(TRIALS):
        out = tmp_path / f"trial-{trial}"
        target, delay = rng.randint(1, 4), rng.uniform(0.0, 0.12)
        with open(tmp_path / f"trial-{trial}.log", "w") as log:
            proc = subprocess.Popen(
                [sys.executable, str(HERE / "crash_train.py"), str(out)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            try:
                deadline = time.monotonic() + 90
                while completed_saves(out) < target and proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.002)
                assert proc.poll() is None, (
                    f"trainer exited early: {(tmp_path / f'trial-{trial}.log').read_text()[-2000:]}"
                )
                time.sleep(delay)
            finally:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

        manifests = {}
        for folder in sorted(out.glob("checkpoint-*")):
            stats["folders"] += 1
            stats["temp_left"] += any(p.name.startswith("." + MANIFEST_NAME) for p in folder.iterdir())
            if (folder / MANIFEST_NAME).exists():
                stats["with_manifest"] += 1
                assert_verifies(folder)
                manifests[folder.name] = manifest_json(folder)["identity"]
            else:
                stats["without"] += 1
        for rec in run_index.read(out):  # every index line names a folder whose manifest it matches
            assert manifests.get(rec["path"]) == rec["identity"], rec
    print(f"crash trials={TRIALS} {stats}")
    assert stats["with_manifest"] > 0
