"""Tiny checkpoints built offline, for the tests, the benchmark and the GPU example.

No model hub is reachable where these run, so models are built from a config
(random weights, fixed seed) with a byte-level BPE tokenizer trained in code.
Needs ``transformers`` and ``tokenizers`` (vLLM depends on both); imported by
nothing else in the plugin.
"""

from __future__ import annotations

import json
import os
import shutil

from ckptpub._filesystem.model_files import read_layout

_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a checkpoint is a folder of safetensors shards and a config",
    "every weight byte is hashed once when the training job saves",
    "engines restart in seconds when a daemon holds the weights",
] * 20


def build_tokenizer(folder: str, vocab_size: int = 512) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(folder)


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
    """Save a random Qwen3 (float32 unless ``dtype`` says otherwise; vLLM's CPU kernels need
    head_dim 64) and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        head_dim=head_dim,
        max_position_embeddings=512,
        tie_word_embeddings=tie_word_embeddings,
        dtype=dtype,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    with torch.no_grad():  # norms start at 1.0; make every tensor carry information
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(folder, **kwargs)
    build_tokenizer(folder, vocab_size=min(vocab, 512))
    return folder


def tensor_location(path: str, name: str) -> tuple[int, int]:
    """Absolute byte range ``[start, end)`` of tensor ``name`` in a safetensors file; ``KeyError`` if absent.

    The header is read by ckptpub's own strict, bounded parser, the one publishing uses.
    """
    layout = read_layout(path, os.path.basename(path))
    tensor = {t.name: t for t in layout.tensors}[name]
    return layout.header_size + tensor.begin, layout.header_size + tensor.end


def find_tensor_file(folder: str, name: str) -> str:
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return os.path.join(folder, json.load(f)["weight_map"][name])
    return os.path.join(folder, "model.safetensors")


def copy_with_zeroed_tensor(src: str, dst: str, name: str) -> str:
    """Copy ``src`` (manifest included) and zero one tensor's bytes in place: same header, same sizes."""
    shutil.copytree(src, dst)
    path = find_tensor_file(dst, name)
    start, end = tensor_location(path, name)
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(bytes(end - start))
    return dst
