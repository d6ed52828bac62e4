"""SGLang's weight stream verified by the SGLang plugin against the plain stream, side by side.

The weight-streaming phase of an SGLang disk load, no engine: SGLang's own
``safetensors_weights_iterator`` over a published Qwen3 checkpoint (the shapes of
``bench_vllm_load.py``, built offline and cached in ``--dir``), each tensor copied into a
preallocated tensor as a model's ``load_weights`` does, one torch thread. ``plain`` is
that stream as it is; ``verified`` the same stream through the plugin's
``TensorVerifier.stream`` (the private copy of each tensor hashed and handed on).
Interleaved, the order swapped every round, page cache warm. Runs in ``.venv-sglang``:

    .venv-sglang/bin/python benchmarks/bench_sglang_stream.py [--shape qwen3-1g|qwen3-0.6b] [--repeat 7]

Prints the wall and CPU seconds of both (medians and minima) and their ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from bench_vllm_load import SHAPES, Run, build, warm


def stream_runs(folder: str, repeat: int) -> dict[str, list[Run]]:
    """``repeat`` timed streams of each kind, interleaved."""
    import torch
    from ckptpub_sglang.loader import TensorVerifier
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    import ckptpub

    manifest = ckptpub.read_manifest(folder)
    shards = [os.path.join(folder, shard) for shard in manifest.weights]
    model = {name: torch.empty_like(tensor) for name, tensor in safetensors_weights_iterator(shards)}

    def once(verify: bool) -> Run:
        start, cpu = time.perf_counter(), time.process_time()
        weights = safetensors_weights_iterator(shards)
        for name, tensor in TensorVerifier(folder, manifest).stream(weights) if verify else weights:
            model[name].copy_(tensor)
        return Run(time.perf_counter() - start, time.process_time() - cpu)

    torch.set_num_threads(1)
    runs: dict[str, list[Run]] = {"plain": [], "verified": []}
    once(True)  # imports, the pool's threads: not counted
    for round_ in range(repeat):
        for kind in ("plain", "verified") if round_ % 2 == 0 else ("verified", "plain"):
            runs[kind].append(once(kind == "verified"))
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-1g")
    parser.add_argument("--dir", help="where the checkpoint is built (default /tmp/ckptpub-bench/SHAPE)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--layers", type=int, help="override the shape's number of layers")
    args = parser.parse_args()
    shape = dict(SHAPES[args.shape], **({} if args.layers is None else {"layers": args.layers}))
    folder = args.dir or f"/tmp/ckptpub-bench/{args.shape}"
    build(folder, shape)
    size = warm(folder)
    runs = stream_runs(folder, args.repeat)
    print(f"checkpoint: {folder} ({args.shape}, {size / 1e9:.2f} GB, page cache warm), {os.cpu_count()} CPUs")
    print("| stream | wall median s | wall min s | CPU median s | CPU min s |")
    print("|---|---|---|---|---|")
    medians = {}
    for kind, timed in runs.items():
        wall, cpu = [r.wall for r in timed], [r.cpu for r in timed]
        medians[kind] = (statistics.median(wall), statistics.median(cpu))
        cells = (medians[kind][0], min(wall), medians[kind][1], min(cpu))
        print(f"| {kind} | {' | '.join(f'{seconds:.3f}' for seconds in cells)} |")
    wall_ratio = medians["verified"][0] / medians["plain"][0]
    cpu_ratio = medians["verified"][1] / medians["plain"][1]
    print(f"verified / plain (medians): wall {wall_ratio:.2f}x, CPU {cpu_ratio:.2f}x")
    print(f"load average {os.getloadavg()[0]:.2f}, {args.repeat} interleaved runs each", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
