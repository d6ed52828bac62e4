"""The tiny model every test, benchmark and example builds, offline: one builder of each piece.

No model hub is reachable where these run, so the model is built from a config (a
Qwen3 of 2 layers and 2 heads of dimension 64, which vLLM's CPU kernels need; random
weights, fixed seed) with a byte-level BPE tokenizer trained in code on a tiny
grammar. It trains in seconds on two CPU cores and vLLM's CPU engine serves it.

* ``build_model``, ``build_tokenizer``: the model and tokenizer (the Trainer tests,
  ``examples/train_tiny.py``, ``examples/fine_tune.py``);
* ``build_tiny_qwen3``: both saved to a folder (the vLLM tests, benchmarks, GPU examples);
* ``build_dataset``, ``make_trainer``: a Trainer over them.
"""

from __future__ import annotations

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


def build_tokenizer(vocab_size: int = 512):
    """A byte-level BPE trained in code on ``corpus()`` and wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<pad>")


def build_model(seed: int = 0, *, spread_norms: bool = False, dtype: str | None = None, **overrides):
    """Qwen3, hidden 128, 2 layers, 2 heads of dimension 64, vocab 512, float32 unless ``dtype`` says.

    ``overrides`` are ``Qwen3Config`` fields. ``spread_norms`` draws the norms' weights
    from [0.5, 1.5] instead of starting them at 1.0, so every tensor carries information
    (a change to any of them changes what the model generates).
    """
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
    if dtype is not None:
        cfg["dtype"] = dtype
    model = AutoModelForCausalLM.from_config(Qwen3Config(**cfg), dtype=getattr(torch, dtype or "float32"))
    if spread_norms:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.uniform_(0.5, 1.5)
    return model


def build_tiny_qwen3(
    folder: str,
    *,
    seed: int = 0,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int | None = None,
    head_dim: int = 64,
    intermediate: int = 256,
    vocab: int = 512,
    max_shard_size: str | int | None = None,
    dtype: str = "float32",
    tie_word_embeddings: bool = False,
) -> str:
    """Save ``build_model`` (norms spread) and ``build_tokenizer`` to ``folder``, as a downloaded model is."""
    model = build_model(
        seed,
        spread_norms=True,
        dtype=dtype,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        head_dim=head_dim,
        vocab_size=vocab,
        tie_word_embeddings=tie_word_embeddings,
    )
    model.save_pretrained(folder, **({} if max_shard_size is None else {"max_shard_size": max_shard_size}))
    build_tokenizer(vocab_size=min(vocab, 512)).save_pretrained(folder)
    return folder


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
