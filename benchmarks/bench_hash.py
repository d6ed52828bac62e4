"""Benchmark: `ckptpub publish` and `ckptpub verify` against `b3sum` on the same warm checkpoint.

Builds a ~2 GB, 4-shard safetensors checkpoint (once; reused if present), then runs
the three commands interleaved (order rotated each round, page cache warm) and
prints median wall times, throughput, the ratio to b3sum, and the peak anonymous
memory (RssAnon: the process's own memory, not mapped file pages) of ckptpub.

    python benchmarks/bench_hash.py [--dir /tmp/ckptpub-bench-hash] [--rounds 9] [--gb 2.1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

HIDDEN, INTERMEDIATE, VOCAB = 2048, 5632, 32000
IN_PROCESS = (
    "import sys, time, ckptpub.compare as c; start = time.perf_counter(); "
    "assert c.verify(sys.argv[1]).ok; print(time.perf_counter() - start)"
)


def build_checkpoint(folder: Path, target_gb: float) -> None:
    """A Llama-shaped float32 model cut into 4 shards, random bytes so nothing compresses or dedups."""
    marker = folder.parent / f"{folder.name}.complete-{target_gb}"  # outside: the folder is hashed whole
    if marker.exists():
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    layer_shapes = {
        "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
        "self_attn.k_proj.weight": (256, HIDDEN),
        "self_attn.v_proj.weight": (256, HIDDEN),
        "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
        "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
        "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
        "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
        "input_layernorm.weight": (HIDDEN,),
        "post_attention_layernorm.weight": (HIDDEN,),
    }
    layer_bytes = sum(4 * int(np.prod(s)) for s in layer_shapes.values())
    fixed = 2 * 4 * VOCAB * HIDDEN
    layers = max(1, round((target_gb * 1e9 - fixed) / layer_bytes))
    names = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "lm_head.weight": (VOCAB, HIDDEN),
        "model.norm.weight": (HIDDEN,),
    }
    for layer in range(layers):
        names.update({f"model.layers.{layer}.{k}": v for k, v in layer_shapes.items()})
    ordered = list(names)
    per_shard = -(-len(ordered) // 4)
    for index in range(4):
        part = ordered[index * per_shard : (index + 1) * per_shard]
        tensors = {
            n: np.frombuffer(rng.bytes(4 * int(np.prod(names[n]))), dtype=np.float32).reshape(names[n])
            for n in part
        }
        save_file(tensors, str(folder / f"model-{index + 1:05d}-of-00004.safetensors"))
        del tensors
    (folder / "config.json").write_text('{"model_type": "llama", "hidden_size": %d}' % HIDDEN)
    marker.touch()


def build_tiny_checkpoint(folder: Path) -> None:
    """One small tensor and a config: a ckptpub run on it is nearly all fixed cost (start-up)."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"weight": np.zeros((16, 16), dtype=np.float32)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text('{"model_type": "llama", "rms_norm_eps": 1e-06}')


def peak_anon_rss(process: subprocess.Popen) -> list[int]:
    """Poll /proc/PID/status every 2 ms for RssAnon (kB) while the process lives."""
    peak = [0]

    def poll() -> None:
        path = f"/proc/{process.pid}/status"
        while process.poll() is None:
            try:
                with open(path) as handle:
                    for line in handle:
                        if line.startswith("RssAnon:"):
                            peak[0] = max(peak[0], int(line.split()[1]))
            except OSError:
                return
            time.sleep(0.002)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    return peak


def timed(command: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = peak_anon_rss(process)
    _, stderr = process.communicate()
    elapsed = time.perf_counter() - start
    if process.returncode != 0:
        sys.exit(f"bench: {' '.join(command)} failed: {stderr.decode().strip()}")
    return elapsed, peak[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/ckptpub-bench-hash"))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--gb", type=float, default=2.1)
    args = parser.parse_args()
    b3sum = shutil.which("b3sum")
    if not b3sum:
        sys.exit("bench: b3sum is not installed (apt-get install b3sum)")
    ckptpub = str(Path(sys.executable).parent / "ckptpub")
    build_checkpoint(args.dir, args.gb)
    files = sorted(str(p) for p in args.dir.iterdir() if p.name != "ckptpub.json")
    size = sum(os.path.getsize(f) for f in files)
    commands = {
        "b3sum": [b3sum, *files],
        "ckptpub publish": [ckptpub, "publish", str(args.dir)],
        "ckptpub verify": [ckptpub, "verify", str(args.dir)],
    }
    # Where the difference comes from: the interpreter's own start, a whole ckptpub run
    # on a one-tensor folder (the fixed cost), and verify() without any start-up.
    python_start = [sys.executable, "-c", "pass"]
    tiny = args.dir.parent / f"{args.dir.name}-tiny"
    build_tiny_checkpoint(tiny)
    timed([ckptpub, "publish", str(tiny)])
    tiny_verify = [ckptpub, "verify", str(tiny)]
    in_process = [sys.executable, "-c", IN_PROCESS, str(args.dir)]
    for command in commands.values():  # warm the page cache and create the manifest
        timed(command)
    times: dict[str, list[float]] = {name: [] for name in commands}
    peaks: dict[str, int] = {name: 0 for name in commands}
    names = list(commands)
    for round_index in range(args.rounds):
        for name in names[round_index % 3 :] + names[: round_index % 3]:
            elapsed, peak = timed(commands[name])
            times[name].append(elapsed)
            peaks[name] = max(peaks[name], peak)
    starts = [timed(python_start)[0] for _ in range(args.rounds)]
    fixed = [timed(tiny_verify)[0] for _ in range(args.rounds)]
    inner = [
        float(subprocess.run(in_process, capture_output=True, text=True, check=True).stdout)
        for _ in range(args.rounds)
    ]
    reference = statistics.median(times["b3sum"])
    tensors = len(json.loads((args.dir / "ckptpub.json").read_text())["tensors"])
    print(
        f"checkpoint: {args.dir} ({size / 1e9:.2f} GB, {len(files)} files, {tensors} tensors), "
        f"{args.rounds} interleaved rounds, warm page cache, {os.cpu_count()} CPUs"
    )
    print(f"{'command':<18}{'median s':>10}{'min s':>9}{'GB/s':>8}{'vs b3sum':>10}{'peak anon MiB':>15}")
    for name in names:
        median = statistics.median(times[name])
        print(
            f"{name:<18}{median:>10.3f}{min(times[name]):>9.3f}{size / median / 1e9:>8.2f}"
            f"{median / reference:>9.2f}x{peaks[name] / 1024:>15.1f}"
        )
    print(
        f"{'verify() inside':<18}{statistics.median(inner):>10.3f}{min(inner):>9.3f}"
        f"{size / statistics.median(inner) / 1e9:>8.2f}{statistics.median(inner) / reference:>9.2f}x"
        f"{'(no interpreter start)':>23}"
    )
    print(
        f"{'verify, 1 tensor':<18}{statistics.median(fixed):>10.3f}{min(fixed):>9.3f}{'':>8}"
        f"{statistics.median(fixed) / reference:>9.2f}x{'(fixed cost of a run)':>22}"
    )
    print(
        f"{'python -c pass':<18}{statistics.median(starts):>10.3f}{min(starts):>9.3f}{'':>8}"
        f"{statistics.median(starts) / reference:>9.2f}x{'(interpreter start)':>20}"
    )


if __name__ == "__main__":
    main()
