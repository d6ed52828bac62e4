"""Engine start on a slow filesystem: what vLLM's key and ckptpub's start work cost, in requests and seconds.

A stand-in for a network filesystem: the checkpoints are served from a FUSE mount
(``support.slowfs.SlowFS``) that waits ``--latency-ms`` (20 ms) on every request and counts
requests per file. One tiny Qwen3 (15 layers, 168 tensors) is re-sharded into 16,
66 and 163 shards (same tensors, so the same identity) and published with ckptpub.
Side by side, per shard count:

(a) the weight-cache key at engine start: vLLM's own ``protocol.hash_checkpoint``
    (it reads every shard's header) against ckptpub's start work on the daemon path
    (the key from ``ckptpub.json`` plus the checks made before weights are mapped);
(b) a real vLLM CPU engine started from disk (``LLM(...)``, engine core in this
    process): ``--load-format auto`` against ``manifest_cache`` (every tensor
    verified), shard opens and seconds. Each engine gets its own copy of the
    checkpoint, so nothing vLLM caches by path helps the second one.

    python benchmarks/bench_engine_start.py [--latency-ms 20] [--shards 16 66 163] [--repeat 3] [--no-engines]

Request counts are deterministic for a given kernel; seconds depend on the load of
the machine, printed beside each figure (1-minute load average). Prints markdown
tables and ratios. Needs FUSE (``make setup`` installs it; the script says what is
missing otherwise).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import time

# the tiny model's one builder lives with the tests (tests/support)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from dataclasses import dataclass

os.environ.setdefault(
    "VLLM_ENABLE_V1_MULTIPROCESSING", "0"
)  # engine core in this process: one timer sees it all

from support.slowfs import FuseUnavailableError, Requests, SlowFS  # noqa: E402

LAYERS = 15  # 11 tensors a layer + 3 = 168 tensors: enough for 163 one-tensor-or-more shards
ENGINE_FORMATS = ("auto", "manifest_cache")


@dataclass
class Row:
    shards: int
    what: str
    requests: Requests
    seconds: list[float]
    load: float
    prefix: str

    def on_shards(self, kinds=None) -> int:
        return self.requests.count(kinds, lambda p: p.startswith(self.prefix) and p.endswith(".safetensors"))

    def in_total(self) -> int:
        """Every request on the mount (it holds only the checkpoints; one is used at a time)."""
        return self.requests.count()


# -- checkpoints -------------------------------------------------------------------------------


def build_base(folder: str) -> None:
    from support.tiny_model import build_tiny_qwen3

    if not os.path.exists(os.path.join(folder, "config.json")):
        build_tiny_qwen3(folder, layers=LAYERS)


def reshard(base: str, dest: str, shards: int) -> None:
    """Copy ``base`` into ``dest`` with its tensors spread over exactly ``shards`` files, then publish it."""
    import json

    from safetensors.torch import load_file, save_file

    import ckptpub

    if os.path.exists(os.path.join(dest, ckptpub.MANIFEST_NAME)):
        return
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(
        base,
        dest,
        ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json", ckptpub.MANIFEST_NAME),
    )
    tensors = load_file(os.path.join(base, "model.safetensors"))
    names = list(tensors)
    if shards > len(names):
        raise SystemExit(f"{base} has {len(names)} tensors, fewer than {shards} shards")
    weight_map, start = {}, 0
    for i in range(shards):
        count = len(names) // shards + (i < len(names) % shards)
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[start : start + count]}
        save_file(part, os.path.join(dest, file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
        start += count
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(dest, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    ckptpub.publish(dest)


# -- (a) the key at engine start ---------------------------------------------------------------


def vllm_key(folder: str) -> None:
    from ckptpub_vllm.shared.key import original_hash_checkpoint

    original_hash_checkpoint()(folder)


def ckptpub_start_work(folder: str) -> None:
    """The checks and the key ckptpub makes before an engine maps weights from a daemon,
    in the loader's order (``ManifestCacheLoader._load_model``)."""
    from ckptpub_vllm.shared.key import checked, checkpoint_key
    from ckptpub_vllm.shared.options import Options
    from ckptpub_vllm.shared.startup import check_before_start

    manifest = check_before_start(folder, Options())
    with checked(folder, manifest):
        checkpoint_key(folder)


def measure(fs: SlowFS, work, folder: str, repeat: int) -> tuple[Requests, list[float]]:
    seconds, requests = [], None
    for _ in range(repeat):
        fs.reset()
        start = time.perf_counter()
        work(folder)
        seconds.append(time.perf_counter() - start)
        requests = fs.requests()  # the same every run: counted on the last
    return requests, seconds


# -- (b) engine start from disk ----------------------------------------------------------------


def start_engine(folder: str, load_format: str) -> float:
    """Seconds to construct ``LLM`` (config, tokenizer, weights, KV cache); the engine is shut down after."""
    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    start = time.perf_counter()
    llm = LLM(
        model=folder,
        load_format=load_format,
        dtype="float32",
        max_model_len=128,
        enforce_eager=True,
        max_num_seqs=2,
        kv_cache_memory_bytes=64 << 20,
        seed=0,
    )
    seconds = time.perf_counter() - start
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()
    return seconds


# -- output ------------------------------------------------------------------------------------


def key_table(rows: list[Row]) -> str:
    lines = [
        "| shards | start work | shard opens | shard reads | shard stats | shard requests | all requests "
        "| seconds (median) | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.shards} | {r.what} | {r.on_shards({'open'})} | {r.on_shards({'read'})} "
            f"| {r.on_shards({'getattr'})} | {r.on_shards()} | {r.in_total()} "
            f"| {statistics.median(r.seconds):.3f} | {r.load:.2f} |"
        )
    return "\n".join(lines)


def engine_table(rows: list[Row]) -> str:
    lines = [
        "| shards | load format | shard opens | shard reads | shard requests | all requests | engine start s "
        "| load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.shards} | {r.what} | {r.on_shards({'open'})} | {r.on_shards({'read'})} "
            f"| {r.on_shards()} | {r.in_total()} | {statistics.median(r.seconds):.2f} | {r.load:.2f} |"
        )
    return "\n".join(lines)


def ratios(rows: list[Row], slow: str, fast: str, label: str) -> str:
    out = []
    for shards in sorted({r.shards for r in rows}):
        a = next(r for r in rows if r.shards == shards and r.what == slow)
        b = next(r for r in rows if r.shards == shards and r.what == fast)
        sa, sb = statistics.median(a.seconds), statistics.median(b.seconds)
        out.append(
            f"{shards} shards: {label} seconds {sa / sb:.2f}x, "
            f"all requests {a.in_total()} vs {b.in_total()}, "
            f"shard opens {a.on_shards({'open'})} vs {b.on_shards({'open'})}"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/ckptpub-bench/engine-start", help="checkpoints (cached here)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="wait on every filesystem request")
    parser.add_argument("--shards", type=int, nargs="+", default=[16, 66, 163])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each key computation (median)")
    parser.add_argument("--no-engines", action="store_true", help="skip (b), the engine starts")
    args = parser.parse_args()

    source = os.path.join(args.dir, "checkpoints")
    base = os.path.join(args.dir, "base")
    build_base(base)
    for n in args.shards:
        reshard(base, os.path.join(source, f"shards-{n}"), n)
        for fmt in ENGINE_FORMATS:  # a copy per engine: nothing vLLM caches by path carries over
            if not os.path.exists(os.path.join(source, f"shards-{n}-{fmt}")):
                shutil.copytree(
                    os.path.join(source, f"shards-{n}"), os.path.join(source, f"shards-{n}-{fmt}")
                )
    import ckptpub_vllm

    ckptpub_vllm.register()
    mountpoint = os.path.join(args.dir, "mnt")
    try:
        fs = SlowFS(source, mountpoint, latency_s=args.latency_ms / 1000)
        fs.start()
    except FuseUnavailableError as e:
        raise SystemExit(f"cannot mount the slow filesystem: {e}") from None
    key_rows, engine_rows = [], []
    with fs:
        for n in args.shards:
            folder = os.path.join(mountpoint, f"shards-{n}")
            prefix = f"/shards-{n}/"
            for what, work in (
                ("vLLM hash_checkpoint", vllm_key),
                ("ckptpub daemon-path start", ckptpub_start_work),
            ):
                requests, seconds = measure(fs, work, folder, args.repeat)
                key_rows.append(Row(n, what, requests, seconds, os.getloadavg()[0], prefix))
                print(f"{n} shards, {what}: {statistics.median(seconds):.3f} s", file=sys.stderr, flush=True)
        if not args.no_engines:
            start_engine(
                base, "auto"
            )  # the first engine pays one-off costs (imports, compilation); not counted
            for i, n in enumerate(args.shards):
                for fmt in ENGINE_FORMATS if i % 2 == 0 else ENGINE_FORMATS[::-1]:
                    fs.reset()
                    seconds = start_engine(os.path.join(mountpoint, f"shards-{n}-{fmt}"), fmt)
                    engine_rows.append(
                        Row(n, fmt, fs.requests(), [seconds], os.getloadavg()[0], f"/shards-{n}-{fmt}/")
                    )
                    print(f"{n} shards, engine {fmt}: {seconds:.2f} s", file=sys.stderr, flush=True)

    print(
        f"\n{args.latency_ms:g} ms per request (FUSE, no attribute cache), {os.cpu_count()} CPUs, "
        f"tiny Qwen3 {LAYERS} layers; load = 1-minute load average after the figure\n"
    )
    print(f"(a) weight-cache key at engine start, median of {args.repeat} runs\n")
    print(key_table(key_rows))
    print()
    print(ratios(key_rows, "vLLM hash_checkpoint", "ckptpub daemon-path start", "vLLM key / ckptpub"))
    if engine_rows:
        print("\n(b) engine start from disk (LLM(...) construction, one run each)\n")
        print(engine_table(engine_rows))
        print()
        print(ratios(engine_rows, "manifest_cache", "auto", "manifest_cache / auto"))


if __name__ == "__main__":
    main()
