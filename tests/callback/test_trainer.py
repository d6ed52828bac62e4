"""PublishCallback with a real Trainer on a tiny offline model (single process).

Each test trains a few dozen steps of the tiny Qwen3 from tests/support/tiny_model.py
and checks the folders on disk with the real ``ckptpub verify`` CLI.
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.runs import checkpoints
from transformers import TrainerCallback

import ckptpub
from ckptpub import PublishCallback
from ckptpub._filesystem import run_index
from ckptpub.integration import RUN_INDEX_NAME
from tests.callback.cbhelpers import assert_verifies, manifest_json


class Pace(TrainerCallback):
    """Pause after the save at ``step`` so rotation really orders checkpoints by mtime.

    transformers falls back to ordering by step number when the checkpoints' mtimes
    span less than a second, which would hide the mtime hazard.
    """

    def __init__(self, step: int = 10, seconds: float = 1.05):
        self.step, self.seconds = step, seconds

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            time.sleep(self.seconds)


class LateWrite(TrainerCallback):
    """At each save, write into the previous checkpoint folder (a late write)."""

    def __init__(self, write):
        self.write = write

    def on_save(self, args, state, control, **kwargs):
        older = Path(args.output_dir) / f"checkpoint-{state.global_step - args.save_steps}"
        if older.is_dir():
            self.write(older)


class SeeLogs(TrainerCallback):
    """A stand-in reporter placed after PublishCallback: records what on_log carries."""

    def __init__(self):
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


def train(tiny, tokenizer, out, *callbacks, model=None, **args):
    trainer = tiny.make_trainer(str(out), model=model, tokenizer=tokenizer, callbacks=callbacks, **args)
    trainer.train()
    return trainer


@pytest.mark.slow
def test_every_checkpoint_published_and_verifies(tiny, tokenizer, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="ckptpub")
    cb, seen = PublishCallback(), SeeLogs()
    trainer = train(tiny, tokenizer, tmp_path, cb, seen, max_steps=20, save_steps=5)

    names = checkpoints(tmp_path)
    assert names == ["checkpoint-5", "checkpoint-10", "checkpoint-15", "checkpoint-20"]
    identities = []
    for name in names:
        assert_verifies(tmp_path / name)
        m = manifest_json(tmp_path / name)
        prov = m["provenance"]
        step = int(name.split("-")[1])
        assert prov["step"] == step
        assert prov["epoch"] == pytest.approx(trainer.state.epoch * step / 20)
        assert prov["run_dir"] == str(tmp_path.resolve())
        assert prov["base_identity"] is None
        assert {"transformers", "torch", "accelerate", "ckptpub"} <= prov["producer"].keys()
        identities.append(m["identity"])
    assert all(a != b for a, b in zip(identities, identities[1:], strict=False)), (
        "consecutive steps share an identity"
    )

    # the run index lists every publish, in order, with paths relative to output_dir
    index = run_index.read(tmp_path)
    assert [(r["step"], r["path"], r["identity"]) for r in index] == [
        (int(n.split("-")[1]), n, i) for n, i in zip(names, identities, strict=True)
    ]
    # identities reach the Trainer's log history, later reporters and the ckptpub logger
    logged = {
        e["ckptpub/step"]: e["ckptpub/identity"] for e in trainer.state.log_history if "ckptpub/identity" in e
    }
    assert logged == {int(n.split("-")[1]): i for n, i in zip(names, identities, strict=True)}
    assert any(log.get("ckptpub/identity") in identities for log in seen.logs)
    assert sum("published step" in r.getMessage() for r in caplog.records) == 4
    assert [p.identity for p in cb.published] == identities
    assert cb.failures == []


@pytest.mark.slow
def test_synchronous_mode(tiny, tokenizer, tmp_path):
    cb = PublishCallback(background=False)
    train(tiny, tokenizer, tmp_path, cb, max_steps=10, save_steps=5)
    for name in checkpoints(tmp_path):
        assert_verifies(tmp_path / name)
    assert [p.step for p in cb.published] == [5, 10]


@pytest.mark.slow
def test_rotation_keeps_the_same_folders_despite_late_writes(tiny, tokenizer, tmp_path):
    """save_total_limit=2: a run with the callback (and a late manifest written into
    the previous folder at every save) keeps exactly the folders a plain run keeps;
    a late write that does not restore the folder's mtime does change them, which
    shows this test can see the hazard."""
    # Three saves: at step 10 the late write lands in checkpoint-5; at step 15
    # rotation (ordering by mtime) must still delete checkpoint-5, not checkpoint-10.
    common = dict(max_steps=15, save_steps=5, save_total_limit=2, logging_steps=100)
    train(tiny, tokenizer, tmp_path / "plain", Pace(), **common)
    expected = checkpoints(tmp_path / "plain")
    assert expected == ["checkpoint-10", "checkpoint-15"]

    late_publish = LateWrite(lambda folder: ckptpub.publish(folder))
    train(tiny, tokenizer, tmp_path / "published", Pace(), PublishCallback(), late_publish, **common)
    assert checkpoints(tmp_path / "published") == expected
    for name in expected:
        assert_verifies(tmp_path / "published" / name)

    def touch(folder):
        (folder / "late.txt").write_text("late")

    train(tiny, tokenizer, tmp_path / "control", Pace(), LateWrite(touch), **common)
    assert checkpoints(tmp_path / "control") != expected, "the mtime hazard did not reproduce"


@pytest.mark.slow
def test_best_checkpoint_end_of_training_deletion(tiny, tokenizer, tmp_path):
    """save_total_limit=1 with a best checkpoint: the Trainer deletes the last
    checkpoint after the final save and before on_train_end, while it may still be
    queued or hashing. No folder may be left with a manifest it does not match."""
    eval_ds = tiny.build_dataset(tokenizer, n=8)
    common = dict(
        max_steps=15,
        save_steps=5,
        eval_strategy="steps",
        eval_steps=5,
        save_total_limit=1,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        greater_is_better=True,
    )

    def run(out, *cbs):
        t = tiny.make_trainer(str(out), tokenizer=tokenizer, callbacks=cbs, eval_dataset=eval_ds, **common)
        t.train()
        return t

    run(tmp_path / "plain")
    cb = PublishCallback()
    run(tmp_path / "published", cb)
    survivors = checkpoints(tmp_path / "published")
    assert survivors == checkpoints(tmp_path / "plain") == ["checkpoint-5"]
    assert_verifies(tmp_path / "published" / "checkpoint-5")
    assert any("step 15 " in f for f in cb.failures), (
        cb.failures
    )  # deleted at the end: skipped, with a warning
    # the deleted folders left nothing behind, not even a lone manifest
    assert sorted(p.name for p in (tmp_path / "published").iterdir()) == [
        "checkpoint-5",
        "ckptpub-index.jsonl",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["epoch", "best"])
def test_other_save_strategies(tiny, tokenizer, tmp_path, strategy):
    """Saves decided at epoch end, or after an evaluation that found a new best."""
    if strategy == "epoch":
        args = dict(save_strategy="epoch", max_steps=-1, num_train_epochs=2, train_size=20)
    else:
        args = dict(
            save_strategy="best",
            eval_strategy="steps",
            eval_steps=5,
            max_steps=15,
            metric_for_best_model="eval_loss",
            eval_dataset=tiny.build_dataset(tokenizer, n=8),
        )
    cb = PublishCallback()
    train(tiny, tokenizer, tmp_path, cb, **args)
    names = checkpoints(tmp_path)
    assert names
    assert cb.failures == []
    for name in names:
        assert_verifies(tmp_path / name)
    assert [r["path"] for r in run_index.read(tmp_path)] == names


@pytest.mark.slow
def test_sharded_safetensors(tiny, tokenizer, tmp_path):
    model = tiny.build_model()
    model.save_pretrained = functools.partial(type(model).save_pretrained, model, max_shard_size="500KB")
    train(tiny, tokenizer, tmp_path, PublishCallback(), model=model, max_steps=10, save_steps=5)
    for name in checkpoints(tmp_path):
        folder = tmp_path / name
        shards = sorted(p.name for p in folder.glob("model-*.safetensors"))
        assert len(shards) > 1
        assert (folder / "model.safetensors.index.json").exists()
        assert_verifies(folder)
        m = manifest_json(folder)
        assert {t["file"] for t in m["tensors"]} == set(shards)


@pytest.mark.slow
def test_save_only_model_from_published_base(tiny, tokenizer, tmp_path):
    """A fine-tune of a folder that has a manifest names its parent's identity."""
    from transformers import AutoModelForCausalLM

    base_dir = tmp_path / "base"
    tiny.build_model().save_pretrained(base_dir)
    base = ckptpub.publish(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    train(
        tiny,
        tokenizer,
        tmp_path / "run",
        PublishCallback(),
        model=model,
        max_steps=10,
        save_steps=5,
        save_only_model=True,
    )
    for name in checkpoints(tmp_path / "run"):
        folder = tmp_path / "run" / name
        assert not (folder / "optimizer.pt").exists()
        assert_verifies(folder)
        assert manifest_json(folder)["provenance"]["base_identity"] == base.identity
        assert manifest_json(folder)["identity"] != base.identity


@pytest.mark.slow
def test_peft_adapter_checkpoints(tiny, tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base_dir = tmp_path / "base"
    tiny.build_model().save_pretrained(base_dir)
    base = ckptpub.publish(base_dir)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    train(tiny, tokenizer, tmp_path / "run", PublishCallback(), model=model, max_steps=10, save_steps=5)
    ids = []
    for name in checkpoints(tmp_path / "run"):
        folder = tmp_path / "run" / name
        assert (folder / "adapter_model.safetensors").exists()
        assert not (folder / "model.safetensors").exists()
        assert_verifies(folder)
        m = manifest_json(folder)
        assert m["provenance"]["base_identity"] == base.identity
        assert any("lora" in t["name"] for t in m["tensors"])
        ids.append(m["identity"])
    assert len(ids) == 2
    assert ids[0] != ids[1]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_nested_distcp_and_deepspeed_style_folders(tiny, tokenizer, tmp_path):
    """Folders with sub-folders of training state, as FSDP (``pytorch_model_fsdp_0/*.distcp``,
    written here with torch.distributed.checkpoint on CPU) and DeepSpeed (``global_stepN/``)
    leave them: every file is covered and verifies. (No FSDP/DeepSpeed run here: no GPU.)"""
    import torch
    import torch.distributed.checkpoint as dcp

    class ShardedStateWriter(TrainerCallback):  # runs before PublishCallback, like the Trainer's own write
        def on_save(self, args, state, control, model=None, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            dcp.save({"model": model.state_dict()}, checkpoint_id=str(folder / "pytorch_model_fsdp_0"))
            ds = folder / f"global_step{state.global_step}"
            ds.mkdir()
            torch.save({"step": state.global_step}, ds / "mp_rank_00_model_states.pt")
            (folder / "latest").write_text(f"global_step{state.global_step}")

    train(tiny, tokenizer, tmp_path, ShardedStateWriter(), PublishCallback(), max_steps=10, save_steps=5)
    for name in checkpoints(tmp_path):
        folder = tmp_path / name
        assert list((folder / "pytorch_model_fsdp_0").glob("*.distcp"))
        assert_verifies(folder)
        paths = {f["path"] for f in manifest_json(folder)["files"]}
        assert any(p.startswith("pytorch_model_fsdp_0/") and p.endswith(".distcp") for p in paths)
        assert f"global_step{name.split('-')[1]}/mp_rank_00_model_states.pt" in paths


def test_hp_search_layout_folder_resolution(tmp_path):
    """Under hyper-parameter search the Trainer writes output_dir/run-{id}/checkpoint-N."""
    from ckptpub._training.callback import checkpoint_folder

    for run, age in (("run-0", 100), ("run-1", 0)):
        folder = tmp_path / run / "checkpoint-5"
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text("{}")
        os.utime(folder / "trainer_state.json", (time.time() - age, time.time() - age))
    assert checkpoint_folder(str(tmp_path), 5, hp_search=True) == str(tmp_path / "run-1" / "checkpoint-5")
    assert checkpoint_folder(str(tmp_path), 5, trial_name="run-0", hp_search=True) == str(
        tmp_path / "run-0" / "checkpoint-5"
    )
    assert checkpoint_folder(str(tmp_path), 7) == str(tmp_path / "checkpoint-7")


def test_folder_deleted_while_hashing_leaves_no_manifest(tmp_path):
    """Rotation deleting a folder mid-publish: a warning and no manifest, never a crash."""
    import shutil

    from ckptpub._training.callback import _Job, _Publisher

    src = tmp_path / "src"
    src.mkdir()
    (src / "trainer_state.json").write_text("{}")
    with open(src / "optimizer.pt", "wb") as f:
        f.write(os.urandom(64 << 20))
    for delay in (0.0, 0.005, 0.02, 0.05):
        folder = tmp_path / f"checkpoint-{int(delay * 1000)}"
        shutil.copytree(src, folder)
        pub = _Publisher(background=True, max_pending=1, require="trainer_state.json")
        pub.submit(_Job(str(folder), 1, {"step": 1}, None))
        time.sleep(delay)
        with pub.rotation_lock:  # what the callback holds around the Trainer's rotation
            shutil.rmtree(folder, ignore_errors=True)
        pub.join()
        assert not folder.exists(), sorted(os.listdir(folder))
        assert len(pub.failures) + len(pub.take_done()) == 1


def test_run_index_skips_a_torn_line(tmp_path):
    (tmp_path / RUN_INDEX_NAME).write_bytes(b'{"step": 1, "path": "checkpoint-1", "ident')
    run_index.append(tmp_path, step=2, path="checkpoint-2", identity="blake3:" + "0" * 64, time=1.0)
    assert [r["step"] for r in run_index.read(tmp_path)] == [2]


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 0, -1.0, "soon"])
def test_a_rank_timeout_that_would_spin_or_overflow_is_refused_at_once(timeout):
    with pytest.raises(ckptpub.CkptpubError, match="^rank_timeout_s: .* is not a positive number of seconds"):
        PublishCallback(rank_timeout_s=timeout)


def test_import_ckptpub_needs_no_transformers():
    """``import ckptpub`` needs no transformers; ``ckptpub.PublishCallback`` is callback's class."""
    code = (
        "import sys, ckptpub;"
        "assert 'transformers' not in sys.modules, 'transformers imported eagerly';"
        "from ckptpub import PublishCallback; import ckptpub._training.callback, transformers;"
        "assert PublishCallback is ckptpub._training.callback.PublishCallback;"
        "assert PublishCallback.__module__ == 'ckptpub._training.callback';"
        "assert issubclass(PublishCallback, transformers.TrainerCallback)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_hyperparameter_search_layout(tiny, tokenizer, tmp_path):
    """A real optuna search writes output_dir/run-{trial}/checkpoint-N; each is published."""
    pytest.importorskip("optuna")
    cb = PublishCallback()
    trainer = tiny.make_trainer(
        str(tmp_path),
        tokenizer=tokenizer,
        callbacks=[cb],
        max_steps=10,
        save_steps=5,
        eval_dataset=tiny.build_dataset(tokenizer, n=8),
    )
    trainer.model_init = lambda trial=None: tiny.build_model()
    trainer.hyperparameter_search(
        hp_space=lambda trial: {"learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True)},
        backend="optuna",
        n_trials=2,
        direction="minimize",
    )
    runs = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert runs == ["run-0", "run-1"]
    for run in runs:
        assert checkpoints(tmp_path / run) == ["checkpoint-5", "checkpoint-10"]
        for name in checkpoints(tmp_path / run):
            assert_verifies(tmp_path / run / name)
            assert manifest_json(tmp_path / run / name)["provenance"]["run_dir"] == str(
                (tmp_path / run).resolve()
            )
    assert [r["path"] for r in run_index.read(tmp_path)] == [
        f"{run}/{name}" for run in runs for name in ("checkpoint-5", "checkpoint-10")
    ]
