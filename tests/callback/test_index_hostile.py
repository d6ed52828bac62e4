"""The callback writes inside ``output_dir`` only: whatever sits at the run index's name, it is not followed.

Generated: every kind of thing at ``ckptpub-index.jsonl`` x ``run_index.append`` (what
the callback calls), then one real Trainer run with the index a symlink out of the
folder: training finishes, every checkpoint is published and verifies, the outside
file is untouched and the refusal is a warning.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from support.runs import checkpoints

import ckptpub
from ckptpub import PublishCallback
from ckptpub._filesystem import run_index
from ckptpub.integration import RUN_INDEX_NAME
from tests.callback.cbhelpers import assert_verifies

IDENTITY = "blake3:" + "0" * 64


def symlink_out(run: Path, outside: Path) -> None:
    os.symlink(outside, run / RUN_INDEX_NAME)


KINDS = {
    "symlink out of the folder": symlink_out,
    "dangling symlink": lambda run, outside: os.symlink(
        outside.with_name("missing.jsonl"), run / RUN_INDEX_NAME
    ),
    "symlink to a file inside": lambda run, outside: (
        (run / "notes.txt").write_text("mine\n"),
        os.symlink("notes.txt", run / RUN_INDEX_NAME),
    ),
    "FIFO": lambda run, outside: os.mknod(run / RUN_INDEX_NAME, 0o644 | stat.S_IFIFO),
    "folder": lambda run, outside: (run / RUN_INDEX_NAME).mkdir(),
}


@pytest.mark.parametrize("kind", KINDS)
def test_append_refuses_what_is_not_a_plain_index(tmp_path: Path, kind: str) -> None:
    run, outside = tmp_path / "run", tmp_path / "outside.jsonl"
    run.mkdir()
    outside.write_text("theirs\n")
    KINDS[kind](run, outside)
    with pytest.raises(ckptpub.CkptpubError, match=RUN_INDEX_NAME):
        run_index.append(run, step=1, path="checkpoint-1", identity=IDENTITY, time=1.0)
    assert outside.read_text() == "theirs\n"
    assert not outside.with_name("missing.jsonl").exists()
    if (run / "notes.txt").exists():
        assert (run / "notes.txt").read_text() == "mine\n"


@pytest.mark.slow
def test_training_continues_when_the_index_is_a_symlink_out(tiny, tokenizer, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="ckptpub")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.jsonl"
    outside.write_text("theirs\n")
    out = tmp_path / "run"
    out.mkdir()
    symlink_out(out, outside)
    cb = PublishCallback(background=False)
    trainer = tiny.make_trainer(str(out), tokenizer=tokenizer, callbacks=(cb,), max_steps=10, save_steps=5)
    trainer.train()
    assert checkpoints(out) == ["checkpoint-5", "checkpoint-10"]
    for name in checkpoints(out):
        assert_verifies(out / name)
    assert [p.step for p in cb.published] == [5, 10]
    assert outside.read_text() == "theirs\n"
    warnings = [
        r.getMessage() for r in caplog.records if "could not append to the run index" in r.getMessage()
    ]
    assert len(warnings) == 2, warnings
    assert "symlink" in warnings[0], warnings


def test_checkpoint_folders_are_not_found_through_symlinks(tmp_path):
    """Under hyper-parameter search the run folder is guessed; a symlink to a folder outside never is."""
    from ckptpub._training.callback import checkpoint_folder

    out, outside = tmp_path / "out", tmp_path / "outside"
    (outside / "checkpoint-5").mkdir(parents=True)
    out.mkdir()
    os.symlink(outside, out / "run-0")
    assert checkpoint_folder(str(out), 5, hp_search=True) == str(out / "checkpoint-5")
