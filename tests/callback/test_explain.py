"""What a user asks of a fine-tune run, answered by ``ckptpub diff``/``show``/``ls``/``log`` in a few lines.

Real Trainer runs of the tiny offline Qwen3 (tests/support/tiny_model.py) from a base
saved and published in the test; every ckptpub command is a real subprocess.
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest

import ckptpub
from ckptpub import PublishCallback
from tests.callback.cbhelpers import run_cli

pytestmark = pytest.mark.slow  # Trainer runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A bf16 base (published), a full fine-tune of it in f32, a LoRA run on it, and the LoRA merged back."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from support import tiny_model as tiny
    from transformers import AutoModelForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as conftest's one_torch_thread does for each test, restored below
    root = tmp_path_factory.mktemp("explain")
    tokenizer = tiny.build_tokenizer()
    base = root / "base"
    tiny.build_model().to(torch.bfloat16).save_pretrained(base)
    ckptpub.publish(base)

    def fine_tune(out, model):
        tiny.make_trainer(
            str(out),
            model=model,
            tokenizer=tokenizer,
            callbacks=[PublishCallback()],
            max_steps=10,
            save_steps=5,
        ).train()

    fine_tune(root / "full", AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32))
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    fine_tune(
        root / "lora", get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), lora)
    )
    adapter = root / "lora" / "checkpoint-10"
    merged = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16), adapter
    )
    merged.merge_and_unload().save_pretrained(root / "merged")
    torch.set_num_threads(threads)
    return root


def cli(*args, expect: int) -> list[str]:
    result = run_cli(*map(str, args))
    assert result.returncode == expect, (args, result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stdout.splitlines()


def test_full_fine_tune_diff_says_the_dtype_changed(runs):
    """310 changed tensors in a real Qwen3 run came from a BF16 -> F32 cast.

    The diff says so, and which config keys changed (use_cache, which the Trainer sets, without
    changing the identity).
    """
    lines = cli("diff", runs / "base", runs / "full" / "checkpoint-10", expect=1)
    assert lines == [
        "lineage  b records a as its base",
        "changed  all 25 tensors: dtype BF16 -> F32",
        'config   config.json: dtype "bfloat16" -> "float32"',
        "config   config.json: use_cache true -> false (does not change the identity)",
    ]
    as_json = json.loads(
        "\n".join(cli("diff", "--json", runs / "base", runs / "full" / "checkpoint-10", expect=1))
    )
    assert as_json["relation"] == "from_a"
    assert len(as_json["tensor_changes"]) == 25
    assert {c["what"] for c in as_json["tensor_changes"]} == {"dtype BF16 -> F32"}
    assert {(c["key"], c["old"], c["new"], c["changes_identity"]) for c in as_json["config_keys"]} == {
        ("dtype", "bfloat16", "float32", True),
        ("use_cache", True, False, False),
    }


def test_config_keys_need_the_folders(runs):
    """Given a manifest file, the config cannot be read: the diff says so instead of guessing."""
    lines = cli("diff", runs / "base" / "ckptpub.json", runs / "full" / "checkpoint-10", expect=1)
    assert (
        lines[-1]
        == "config   config.json differs; keys not compared: a: given as a manifest file, not a folder"
    )


def test_adapter_diff_says_it_applies_to_the_base(runs):
    lines = cli("diff", runs / "base", runs / "lora" / "checkpoint-10", expect=1)
    base = ckptpub.read_manifest(runs / "base").identity
    assert lines[0] == f"lineage  b is an adapter on a ({base[:19]}): its 8 tensors apply on top of that base"
    assert lines[1:] == [
        "added    base_model.model.model.layers.*.self_attn.{q,v}_proj.lora_{A,B}.weight in layers 0-1: "
        "F32 (8 tensors)",
    ]
    shown = cli("show", runs / "lora" / "checkpoint-10", expect=0)
    assert shown[1].split(None, 1) == ["kind:", f"adapter on base {base}"]


def test_merged_lora_published_with_its_base_diffs_as_one_grouped_line(runs, tmp_path):
    merged = tmp_path / "merged"
    shutil.copytree(runs / "merged", merged)
    adapter = runs / "lora" / "checkpoint-10"
    cli("publish", merged, "--base", runs / "base", "--adapter", adapter, expect=0)
    assert cli("diff", runs / "base", merged, expect=1) == [
        "lineage  b records a as its base",
        "changed  model.layers.*.self_attn.{q,v}_proj.weight in layers 0-1: bytes (4 tensors)",
    ]
    provenance = ckptpub.read_manifest(merged).provenance
    assert provenance["base_identity"] == ckptpub.read_manifest(runs / "base").identity
    assert provenance["adapter_identity"] == ckptpub.read_manifest(adapter).identity
    shown = "\n".join(cli("show", merged, expect=0))
    assert "kind:             model on base blake3:" in shown
    assert "adapter_identity: blake3:" in shown


def test_publish_refuses_an_unpublished_base(runs, tmp_path):
    merged = tmp_path / "merged"
    shutil.copytree(runs / "merged", merged)
    result = run_cli("publish", str(merged), "--base", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("ckptpub: error: base: ")
    assert f"publish it first: ckptpub publish {tmp_path}" in result.stderr
    assert not (merged / "ckptpub.json").exists()
    with pytest.raises(ckptpub.CkptpubError, match="not of the form"):
        ckptpub.publish(merged, base="blake3:1234")


def test_ls_reads_the_index_and_log_shows_the_lineage(runs, tmp_path):
    run = tmp_path / "full"
    shutil.copytree(runs / "full", run)
    shutil.rmtree(run / "checkpoint-5")  # rotated away: the index still names it
    base = ckptpub.read_manifest(runs / "base").identity
    ids = [ckptpub.read_manifest(runs / "full" / f"checkpoint-{s}").identity for s in (5, 10)]
    lines = cli("ls", run, expect=0)
    assert lines[0].split() == ["STEP", "IDENTITY", "SIZE", "BASE", "NOTE", "PATH"]
    assert [line.split() for line in lines[1:]] == [
        ["5", ids[0][:19], "-", "-", "gone", "checkpoint-5"],
        ["10", ids[1][:19], "5.6", "MB", base[:19], "checkpoint-10"],
    ]
    rows = json.loads("\n".join(cli("ls", "--json", run, expect=0)))
    assert [(r["step"], r["status"], r["source"]) for r in rows] == [
        (5, "gone", "index"),
        (10, "ok", "index"),
    ]
    assert cli("log", run, expect=0) == [
        f"base {base[:19]} (not in this run)",
        f"`- step 10    {ids[1][:19]}  checkpoint-10",
    ]
    assert cli("ls", "--tree", run, expect=0) == cli("log", run, expect=0)


def test_unpublished_base_warns_once_and_ls_marks_a_resave(tiny, tokenizer, tmp_path, caplog):
    """A base without a manifest: one warning at train start saying how to fix it. With a zero learning
    rate the weights do not move, so step 10 is a re-save of step 5: ``ls`` marks it."""
    from transformers import AutoModelForCausalLM

    base = tmp_path / "base"
    tiny.build_model().save_pretrained(base)
    trainer = tiny.make_trainer(
        str(tmp_path / "run"),
        model=AutoModelForCausalLM.from_pretrained(base),
        tokenizer=tokenizer,
        max_steps=10,
        save_steps=5,
        learning_rate=0.0,
    )
    trainer.add_callback(PublishCallback())
    with caplog.at_level(logging.WARNING, logger="ckptpub"):
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if r.name == "ckptpub"]
    assert warnings == [
        f"ckptpub: the base model {base} has no ckptpub.json, so this run's checkpoints will record "
        f"no base_identity; publish it before training: ckptpub publish {base}, or pass "
        "PublishCallback(publish_base=True) to publish it in the background"
    ]
    lines = cli("ls", tmp_path / "run", expect=0)
    assert [line.split()[-2:] for line in lines[1:]] == [["-", "checkpoint-5"], ["=prev", "checkpoint-10"]]
    shown = cli("show", tmp_path / "run" / "checkpoint-10", expect=0)
    assert shown[1].split(None, 1) == ["kind:", "model (no base recorded)"]
    assert "None" not in "\n".join(shown)


def test_console_printer_shows_the_identity_when_the_callback_is_passed_to_the_trainer(
    tiny, tokenizer, tmp_path, capsys
):
    """docs/callback.md: ``Trainer(callbacks=[PublishCallback()])`` runs before the console printer
    (``add_callback`` runs after it, and the printed line lacks the identity)."""
    for where in ("constructor", "add_callback"):
        callback = PublishCallback(background=False)
        trainer = tiny.make_trainer(
            str(tmp_path / where),
            tokenizer=tokenizer,
            max_steps=10,
            save_steps=5,
            callbacks=[callback] if where == "constructor" else [],
        )
        if where == "add_callback":
            trainer.add_callback(callback)
        capsys.readouterr()
        trainer.train()
        printed = [line for line in capsys.readouterr().out.splitlines() if "'loss'" in line]
        with_identity = [
            line for line in printed if f"'ckptpub/identity': '{callback.published[0].identity}'" in line
        ]
        assert printed, where
        assert bool(with_identity) == (where == "constructor"), (where, printed)
