"""An adapter's verified load (``manifest_cache``) against vLLM's own adapter load, side by side.

Builds synthetic PEFT LoRA adapters of a 7B-like model's layer shapes (Llama-2-7B:
32 layers, hidden 4096, intermediate 11008; random bfloat16 tensors, written with
``safetensors``) and publishes them with ckptpub. Then, interleaved, the order
swapped every round, with the page cache warm:

* ``vLLM``: what vLLM's ``WorkerLoRAManager._load_adapter`` does with the files,
  ``PEFTHelper.from_local_dir`` then ``LoRAModel.from_local_checkpoint`` (on CPU),
  whose tensors map the file and are read only when used;
* ``ckptpub``: ``adapters.load_checked``, what a ``manifest_cache`` worker runs
  instead: the manifest read and base check, one read of each file (the weights into
  memory the previous load left, as vLLM dropped it), every tensor hashed and
  compared (``hash_threads`` 2), then the same vLLM load served from those bytes.

Both then read every weight once (a sum of each tensor), as activating the adapter
does when vLLM copies it into its LoRA slots, so both times end with the bytes in memory.

    python benchmarks/bench_lora_load.py [--dir DIR] [--repeat 9] [--layers 32]

Prints one row per adapter: size, medians and minima of both, the ratio of the
medians, and where ckptpub's time goes (medians): the one read of the weight file into
memory already touched (``ckptpub.serving.read_weights_file``) and the whole check without
vLLM's load (``read_checked``: that read, the config's, and the hashing). ``--layers 1`` makes toy adapters
(the smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

HIDDEN, INTERMEDIATE = 4096, 11008
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
#: (rank, target modules) of each adapter measured.
ADAPTERS = {"rank 16, attention": (16, ATTENTION), "rank 64, all linear": (64, ATTENTION + MLP)}
#: A base identity the adapters record, and the served base claims: the base check passes.
BASE_IDENTITY = "blake3:" + "b" * 64


def _shape(module: str) -> tuple[int, int]:
    """(in, out) features of a Llama-2-7B linear layer."""
    if module in ("gate_proj", "up_proj"):
        return HIDDEN, INTERMEDIATE
    if module == "down_proj":
        return INTERMEDIATE, HIDDEN
    return HIDDEN, HIDDEN


def build(folder: str, rank: int, modules: tuple[str, ...], layers: int) -> None:
    """A PEFT-layout adapter (``adapter_config.json``, ``adapter_model.safetensors``), published."""
    import torch
    from safetensors.torch import save_file

    import ckptpub

    if os.path.exists(os.path.join(folder, ckptpub.MANIFEST_NAME)):
        return
    os.makedirs(folder, exist_ok=True)
    generator = torch.Generator().manual_seed(rank)
    tensors = {}
    for layer in range(layers):
        for module in modules:
            part = "self_attn" if module in ATTENTION else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{module}"
            features_in, features_out = _shape(module)
            for matrix, shape in (("lora_A", (rank, features_in)), ("lora_B", (features_out, rank))):
                values = torch.randn(shape, generator=generator, dtype=torch.float32) / 64
                tensors[f"{prefix}.{matrix}.weight"] = values.to(torch.bfloat16)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(modules)}
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(config | {"bias": "none", "base_model_name_or_path": "llama-2-7b-like"}, f, indent=2)
    ckptpub.publish(folder, base=BASE_IDENTITY)


def vllm_load(request):  # type: ignore[no-untyped-def]
    """vLLM's adapter load on CPU, as ``WorkerLoRAManager._load_adapter`` calls it."""
    import torch
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    helper = PEFTHelper.from_local_dir(request.lora_path, 4096)
    modules = set(ATTENTION + MLP)
    return LoRAModel.from_local_checkpoint(
        request.lora_path, modules, helper, lora_model_id=1, device="cpu", dtype=torch.bfloat16
    )


def load_and_touch(load, request) -> float:  # type: ignore[no-untyped-def]
    """Seconds to load the adapter and read each of its weights once."""
    start = time.perf_counter()
    lora = load(request)
    for weights in lora.loras.values():
        weights.lora_a.sum()
        weights.lora_b.sum()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/tmp/ckptpub-bench/lora")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--layers", type=int, default=32)
    args = parser.parse_args()

    import torch
    from ckptpub_vllm.shared.options import Options
    from ckptpub_vllm.worker import adapters
    from vllm.lora.request import LoRARequest

    import ckptpub
    from ckptpub.serving import read_weights_file

    torch.set_num_threads(1)  # as vLLM's CPU worker runs
    adapters.install()
    base = adapters.ServedBase("llama-2-7b-like", BASE_IDENTITY, Options())
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {_cpu_model()}")
    columns = ("adapter", "size MB", "vLLM median s", "ckptpub median s", "vLLM min s", "ckptpub min s")
    print(f"| {' | '.join(columns)} | ratio (medians) | of which: read s | read and check s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, (rank, modules) in ADAPTERS.items():
        folder = os.path.join(args.dir, f"layers{args.layers}-r{rank}-{len(modules)}m")
        build(folder, rank, modules, args.layers)
        request = LoRARequest(label, 1, folder)
        size = os.path.getsize(os.path.join(folder, "adapter_model.safetensors"))
        runs: dict[str, list[float]] = {"vllm": [], "ckptpub": [], "read": [], "check": []}
        loads = {"vllm": vllm_load, "ckptpub": lambda r: adapters.load_checked(r, base, vllm_load)}
        loads["ckptpub"](request)  # warm: page cache, imports
        manifest = ckptpub.read_manifest(folder)
        weights = next(r for r in manifest.files if r.path == "adapter_model.safetensors")
        touched = memoryview(bytearray(weights.size))
        for round_ in range(args.repeat):
            order = ("vllm", "ckptpub") if round_ % 2 == 0 else ("ckptpub", "vllm")
            for name in order:
                runs[name].append(load_and_touch(loads[name], request))
            runs["read"].append(_timed(read_weights_file, folder, weights, lambda _, memory=touched: memory))
            runs["check"].append(_timed(adapters.read_checked, folder, manifest, base.options))
        median = {name: statistics.median(times) for name, times in runs.items()}
        ratio = median["ckptpub"] / median["vllm"]
        print(
            f"| {label} | {size / 1e6:.1f} | {median['vllm']:.3f} | {median['ckptpub']:.3f} "
            f"| {min(runs['vllm']):.3f} | {min(runs['ckptpub']):.3f} | {ratio:.2f}x "
            f"| {median['read']:.3f} | {median['check']:.3f} |"
        )
    print(f"load average {os.getloadavg()[0]:.2f}, {args.repeat} interleaved runs each", file=sys.stderr)
    return 0


def _timed(function, *args) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    function(*args)
    return time.perf_counter() - start


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
