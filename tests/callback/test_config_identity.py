"""The identity covers what changes an engine's output, on configs transformers itself writes.

One set of weights, configs saved by transformers' own config classes
(``save_pretrained``), each changed in one way: a key that only chooses what a
forward returns to training code leaves the identity alone; every kind of key an
engine computes with (architecture, sizes, rope, norm eps, dtype, vocabulary,
quantization, a sub-config's sizes) changes it. And the case that made the rule: a
Trainer checkpoint (``use_cache`` false) and the same weights exported with
``save_pretrained`` (``use_cache`` true) are one model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.checkpoints import raw_shard
from transformers import LlavaConfig, PretrainedConfig, Qwen3Config, Qwen3MoeConfig

import ckptpub
from ckptpub import PublishCallback
from ckptpub._format.config_meaning import INERT
from ckptpub._format.manifest import config_digest
from tests.callback.cbhelpers import run_cli

WEIGHTS = raw_shard({"model.embed_tokens.weight": ("F32", [2, 2], bytes(range(16)))})


def qwen3(**changes: Any) -> Qwen3Config:
    config = Qwen3Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=32, vocab_size=128, architectures=["Qwen3ForCausalLM"],
    )  # fmt: skip
    for key, value in changes.items():
        setattr(config, key, value)
    return config


def qwen3_moe(**changes: Any) -> Qwen3MoeConfig:
    config = Qwen3MoeConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    for key, value in changes.items():
        setattr(config, key, value)
    return config


def llava(**text_changes: Any) -> LlavaConfig:
    config = LlavaConfig()
    for key, value in text_changes.items():
        setattr(config.text_config, key, value)
    return config


def identity(folder: Path, config: PretrainedConfig) -> str:
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(WEIGHTS)
    config.save_pretrained(folder)
    return ckptpub.build_manifest(folder).identity


def saved(config: PretrainedConfig, tmp_path: Path) -> dict:
    config.save_pretrained(tmp_path)
    return json.loads((tmp_path / "config.json").read_text())


INERT_CHANGES: dict[str, tuple[Callable[..., PretrainedConfig], dict[str, Any]]] = {
    "use_cache": (qwen3, {"use_cache": False}),
    "output_attentions": (qwen3, {"output_attentions": True}),
    "output_hidden_states": (qwen3, {"output_hidden_states": True}),
    "return_dict": (qwen3, {"return_dict": False}),
    "torchscript": (qwen3, {"torchscript": True}),  # written by transformers 4.x
    "output_router_logits": (qwen3_moe, {"output_router_logits": True}),
    "use_cache in a sub-config": (llava, {"use_cache": False}),
}

MEANINGFUL_CHANGES: dict[str, tuple[Callable[..., PretrainedConfig], dict[str, Any]]] = {
    "architecture": (qwen3, {"architectures": ["Qwen3ForSequenceClassification"]}),
    "sizes": (qwen3, {"intermediate_size": 128}),
    "rope": (qwen3, {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
    "norm eps": (qwen3, {"rms_norm_eps": 1e-05}),
    "dtype": (qwen3, {"dtype": "bfloat16"}),
    "vocabulary": (qwen3, {"vocab_size": 256}),
    "special tokens": (qwen3, {"eos_token_id": 2}),
    "quantization": (
        qwen3,
        {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
    ),
    "sliding window": (qwen3, {"use_sliding_window": True}),
    "a sub-config's sizes": (llava, {"intermediate_size": 4096}),
    "a label named use_cache (not a sub-config)": (qwen3, {"label2id": {"use_cache": 0}}),
    "router experts": (qwen3_moe, {"num_experts_per_tok": 4}),
}


@pytest.mark.parametrize("change", sorted(INERT_CHANGES))
def test_a_key_that_only_chooses_what_a_forward_returns_keeps_the_identity(
    tmp_path: Path, change: str
) -> None:
    build, changes = INERT_CHANGES[change]
    before, after = saved(build(), tmp_path / "a"), saved(build(**changes), tmp_path / "b")
    assert before != after, "the change must reach config.json"
    assert identity(tmp_path / "base", build()) == identity(tmp_path / "changed", build(**changes))
    assert config_digest(before) == config_digest(after)


@pytest.mark.parametrize("change", sorted(MEANINGFUL_CHANGES))
def test_a_key_an_engine_computes_with_changes_the_identity(tmp_path: Path, change: str) -> None:
    build, changes = MEANINGFUL_CHANGES[change]
    assert saved(build(), tmp_path / "a") != saved(build(**changes), tmp_path / "b")
    assert identity(tmp_path / "base", build()) != identity(tmp_path / "changed", build(**changes))


def test_every_inert_key_is_tested() -> None:
    assert {changes_key for _, changes in INERT_CHANGES.values() for changes_key in changes} == set(INERT)


@pytest.mark.slow
def test_a_trainer_checkpoint_and_its_save_pretrained_export_are_one_model(
    tiny, tokenizer, tmp_path: Path
) -> None:
    trainer = tiny.make_trainer(
        str(tmp_path / "run"), tokenizer=tokenizer, callbacks=[PublishCallback()], max_steps=2, save_steps=2
    )
    trainer.train()
    checkpoint = tmp_path / "run" / "checkpoint-2"
    assert (
        json.loads((checkpoint / "config.json").read_text())["use_cache"] is False
    )  # TrainingArguments' default
    trainer.model.config.use_cache = True  # as before serving it
    export = tmp_path / "export"
    trainer.model.save_pretrained(export)
    assert json.loads((export / "config.json").read_text())["use_cache"] is True
    assert ckptpub.publish(export).identity == ckptpub.read_manifest(checkpoint).identity
    result = run_cli("diff", str(checkpoint), str(export))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        f"same identity {ckptpub.read_manifest(export).identity}",
        "config   config.json: use_cache false -> true (does not change the identity)",
    ]
