"""Train a tiny causal LM offline with ckptpub's PublishCallback (used by ``make demo``).

Why it exists: the demo and the tests need a real Trainer run that needs no model
hub and takes seconds on two CPU cores, yet produces checkpoints vLLM's CPU engine
can serve (Qwen3, 2 layers, 2 heads of dimension 64 - its CPU kernels refuse 16).

    python examples/train_tiny.py OUT_DIR [--steps 40] [--save-steps 10]

Writes OUT_DIR/checkpoint-N (each with ckptpub.json), OUT_DIR/ckptpub-index.jsonl,
and the final model in OUT_DIR/final (published with ``ckptpub.publish``).
"""

from __future__ import annotations

import argparse
import os
import random

SEQ_LEN = 32
_WORDS = [
    "the",
    "a",
    "one",
    "cat",
    "dog",
    "bird",
    "fish",
    "model",
    "token",
    "weight",
    "layer",
    "step",
    "run",
    "save",
    "load",
    "hash",
    "byte",
    "reads",
    "writes",
    "trains",
    "serves",
    "keeps",
    "sees",
    "finds",
    "makes",
    "small",
    "big",
    "fast",
    "slow",
    "red",
    "blue",
    "new",
    "old",
]


def corpus(n: int = 800, seed: int = 0) -> list[str]:
    """Sentences from a tiny grammar: learnable in a few dozen steps, fully offline."""
    rng = random.Random(seed)
    nouns, verbs, adjs = _WORDS[2:14], _WORDS[18:26], _WORDS[26:]
    return [
        f"{rng.choice(['the', 'a', 'one'])} {rng.choice(adjs)} {rng.choice(nouns)} "
        f"{rng.choice(verbs)} the {rng.choice(nouns)}."
        for _ in range(n)
    ]


def build_tokenizer():
    """A byte-level BPE (vocab 512) trained in code and wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<|endoftext|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<pad>")


def build_model(seed: int = 0, **overrides):
    """Qwen3, hidden 128, 2 layers, 2 heads of dimension 64, vocab 512, float32."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    cfg = dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
    )
    cfg.update(overrides)
    return AutoModelForCausalLM.from_config(Qwen3Config(**cfg), dtype="float32")


def build_dataset(tokenizer, n: int = 256):
    """Fixed-length blocks of the tokenized corpus, labels = inputs (causal LM)."""
    import torch

    ids: list[int] = []
    for line in corpus():
        ids += tokenizer(line)["input_ids"] + [tokenizer.eos_token_id]
    blocks = [ids[i : i + SEQ_LEN] for i in range(0, len(ids) - SEQ_LEN, SEQ_LEN)][:n]

    class Blocks(torch.utils.data.Dataset):
        def __len__(self):
            return len(blocks)

        def __getitem__(self, i):
            t = torch.tensor(blocks[i])
            return {"input_ids": t, "labels": t.clone()}

    return Blocks()


def make_trainer(
    output_dir: str,
    *,
    model=None,
    tokenizer=None,
    callbacks=(),
    eval_dataset=None,
    train_size=256,
    **arg_overrides,
):
    """A Trainer over the tiny model and data; ``arg_overrides`` go to TrainingArguments."""
    from transformers import Trainer, TrainingArguments

    tokenizer = tokenizer or build_tokenizer()
    model = model if model is not None else build_model()
    kwargs = dict(
        output_dir=output_dir,
        max_steps=20,
        save_steps=5,
        save_strategy="steps",
        logging_steps=5,
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    kwargs.update(arg_overrides)
    return Trainer(
        model=model,
        args=TrainingArguments(**kwargs),
        train_dataset=build_dataset(tokenizer, n=train_size),
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        callbacks=list(callbacks),
    )


def main(argv: list[str] | None = None) -> int:
    import logging

    import ckptpub
    from ckptpub import PublishCallback

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger("ckptpub").addHandler(handler)
    logging.getLogger("ckptpub").setLevel(logging.INFO)  # one line per published checkpoint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output_dir")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--save-steps", type=int, default=10)
    ap.add_argument("--sync", action="store_true", help="publish inside on_save instead of in the background")
    a = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)  # a model this small is fastest on one thread, and robust on a busy machine
    trainer = make_trainer(a.output_dir, max_steps=a.steps, save_steps=a.save_steps)
    trainer.add_callback(PublishCallback(background=not a.sync))
    trainer.train()
    final = os.path.join(a.output_dir, "final")
    trainer.save_model(final)  # fires no callback event: publish it explicitly
    manifest = ckptpub.publish(
        final, provenance={"step": int(trainer.state.global_step), "run_dir": os.path.abspath(a.output_dir)}
    )
    print(f"final model {final}: {manifest.identity}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
