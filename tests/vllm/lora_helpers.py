"""LoRA adapters for the tests: PEFT adapters on the tiny Qwen3, published with the CLI, and damaged copies.

``init_lora_weights=False`` gives random ``lora_B`` tensors (PEFT's default zeroes
them), so an adapter changes the answers and the tokens show which weights answered.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from support.safetensors_files import tensor_location
from support.tiny_model import build_tiny_qwen3
from support.vllm_engine_helpers import same_size_edit

import ckptpub

TARGETS = ["q_proj", "v_proj"]
#: Deep in the adapter: the last layer's value projection, its B matrix.
TAMPERED_LORA_B = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"


def build_adapter(base: str, folder: str, seed: int, rank: int = 8) -> str:
    """Save a PEFT LoRA adapter of ``base`` with random A and B (seeded) to ``folder``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base)
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=16, target_modules=TARGETS, init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(folder)
    return folder


def publish(folder: str, *args: str) -> str:
    """``ckptpub publish FOLDER ARGS...`` as a user runs it; returns the identity it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "ckptpub", "publish", folder, *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()[0]


def flip_bit(path: str, tensor: str) -> None:
    """Flip one bit in the middle of ``tensor``'s bytes in the safetensors file at ``path``."""
    start, end = tensor_location(path, tensor)
    with open(path, "r+b") as f:
        f.seek(start + (end - start) // 2)
        byte = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([byte ^ 0x10]))


def build_lora_folders(root: str) -> dict[str, str]:
    """The base, another base of the same shapes, and the adapters every LoRA test serves.

    ``good``/``second``: adapters of ``base`` published with ``--base``; ``nobase``:
    ``good`` published without it; ``tampered``: ``good`` with one bit of a ``lora_B``
    flipped; ``config``: ``good`` with ``lora_alpha`` edited in ``adapter_config.json``
    (same size); ``wrong_base``: trained on ``other_base`` and published so;
    ``nomanifest``: ``good`` without its manifest. Each test copies what it alters.
    """
    base = build_tiny_qwen3(os.path.join(root, "base"))
    other_base = build_tiny_qwen3(os.path.join(root, "other_base"), seed=1)
    publish(base)
    publish(other_base)
    folders = {"base": base, "other_base": other_base}
    for name, on, seed in (("good", base, 1), ("second", base, 2), ("wrong_base", other_base, 1)):
        folders[name] = build_adapter(on, os.path.join(root, name), seed)
        publish(folders[name], "--base", on)
    folders["nobase"] = shutil.copytree(folders["good"], os.path.join(root, "nobase"))
    publish(folders["nobase"])
    folders["tampered"] = shutil.copytree(folders["good"], os.path.join(root, "tampered"))
    flip_bit(os.path.join(folders["tampered"], "adapter_model.safetensors"), TAMPERED_LORA_B)
    folders["config"] = shutil.copytree(folders["good"], os.path.join(root, "config"))
    same_size_edit(
        os.path.join(folders["config"], "adapter_config.json"), b'"lora_alpha": 16', b'"lora_alpha": 32'
    )
    folders["nomanifest"] = shutil.copytree(folders["good"], os.path.join(root, "nomanifest"))
    os.remove(os.path.join(folders["nomanifest"], ckptpub.MANIFEST_NAME))
    return folders
