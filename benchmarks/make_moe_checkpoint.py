"""A synthetic mixture-of-experts checkpoint: many small bf16 tensors in many shards.

DeepSeek-V3 has about 91k tensors in 163 shards. The default here is 98,304 tensors
(64 layers x 512 experts x 3 projections) of 1 KiB each in 163 shards, about 100 MB,
so that the cost per tensor, not per byte, dominates every command. Shards are
written by the real ``safetensors`` library; an index and a small config sit beside
them, as in a Hugging Face checkpoint. Content is random (seeded), so no two tensors
are equal.

    python benchmarks/make_moe_checkpoint.py /tmp/moe [--layers 64] [--experts 512] [--shards 163]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def tensor_names(layers: int, experts: int) -> list[str]:
    """Names in the order a Hugging Face MoE model lists them."""
    return [
        f"model.layers.{layer}.mlp.experts.{expert}.{projection}.weight"
        for layer in range(layers)
        for expert in range(experts)
        for projection in PROJECTIONS
    ]


def write(folder: Path, *, layers: int, experts: int, shards: int, elements: int, seed: int = 0) -> int:
    """Write the checkpoint into ``folder`` (replaced if present); return its tensor count."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    names = tensor_names(layers, experts)
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(len(names), elements, generator=generator).to(torch.bfloat16)
    per_shard = -(-len(names) // shards)
    weight_map = {}
    for index in range(shards):
        chunk = names[index * per_shard : (index + 1) * per_shard]
        if not chunk:
            break
        shard = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        first = index * per_shard
        save_file(
            {name: values[first + i].clone() for i, name in enumerate(chunk)},
            str(folder / shard),
            metadata={"format": "pt"},
        )
        weight_map.update(dict.fromkeys(chunk, shard))
    index_document = {"metadata": {"total_size": 2 * elements * len(names)}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index_document, indent=2))
    config = {
        "architectures": ["SyntheticMoeForCausalLM"],
        "model_type": "synthetic_moe",
        "num_hidden_layers": layers,
        "n_routed_experts": experts,
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return len(names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--layers", type=int, default=64)
    parser.add_argument("--experts", type=int, default=512)
    parser.add_argument("--shards", type=int, default=163)
    parser.add_argument("--elements", type=int, default=512, help="bf16 elements per tensor (512 = 1 KiB)")
    args = parser.parse_args()
    count = write(
        args.folder, layers=args.layers, experts=args.experts, shards=args.shards, elements=args.elements
    )
    print(f"{args.folder}: {count} tensors in {args.shards} shards")


if __name__ == "__main__":
    main()
