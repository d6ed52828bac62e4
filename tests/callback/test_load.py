"""Load test: 200 consecutive saves with background publishing and save_total_limit=2.

Every surviving checkpoint verifies, the run index agrees with the folders, and no
file descriptor or thread outlives the run.
"""

from __future__ import annotations

import os
import threading

import pytest
from support.runs import checkpoints

from ckptpub import PublishCallback
from ckptpub._filesystem import run_index
from tests.callback.cbhelpers import assert_verifies, manifest_json

pytestmark = pytest.mark.slow  # a Trainer run of 200 saves

SAVES = 200


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def threads_but_tqdm() -> int:
    """Live threads, not counting tqdm's monitor (an earlier in-process Trainer may have started it)."""
    return threading.active_count() - ("tqdm_monitor" in {t.name for t in threading.enumerate()})


def test_two_hundred_saves(tiny, tokenizer, tmp_path):
    model = tiny.build_model()
    fds, threads = open_fds(), threads_but_tqdm()
    callback = PublishCallback()
    trainer = tiny.make_trainer(
        str(tmp_path),
        model=model,
        tokenizer=tokenizer,
        callbacks=[callback],
        max_steps=SAVES,
        save_steps=1,
        save_total_limit=2,
        logging_steps=50,
        train_size=SAVES * 4,
    )
    trainer.train()
    del trainer

    survivors = checkpoints(tmp_path)
    assert survivors == [f"checkpoint-{SAVES - 1}", f"checkpoint-{SAVES}"]
    for name in survivors:
        assert_verifies(tmp_path / name)

    index = run_index.read(tmp_path)
    steps = [record["step"] for record in index]
    published = {p.step for p in callback.published}
    assert steps == sorted(steps)
    assert len(steps) == len(set(steps)) == len(published)
    assert published <= set(range(1, SAVES + 1))
    assert {SAVES - 1, SAVES} <= published
    by_path = {record["path"]: record["identity"] for record in index}
    for name in survivors:
        assert by_path[name] == manifest_json(tmp_path / name)["identity"]
    skipped = len(callback.failures)
    assert len(published) + skipped == SAVES, callback.failures[:3]
    for why in callback.failures:  # a save is skipped only because rotation took its folder first
        assert "rotated away" in why or "deleted while publishing" in why or "removed before" in why, why

    assert open_fds() == fds, "file descriptors leaked"
    # tqdm (transformers' progress bars) keeps a monitor thread of its own; ours must all be gone
    ours = [t.name for t in threading.enumerate() if t.name.startswith("ckptpub")]
    assert ours == []
    assert threads_but_tqdm() == threads
    print(
        f"load test: {SAVES} saves, {len(published)} published, {skipped} skipped (rotated first), "
        f"{len(survivors)} surviving folders verify, fds {fds}->{open_fds()}, "
        f"ckptpub threads left {len(ours)}"
    )
