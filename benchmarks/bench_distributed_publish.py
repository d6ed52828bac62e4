"""Publish time of one checkpoint hashed by 1, 2 and 4 ranks, each reading through its own capped link.

Each rank reads the checkpoint through its own FUSE mount of the same folder
(``support.slowfs.SlowFS``, no added latency, ``--mbps`` MB/s per mount: a stand-in for one
node's link to shared storage), so publish time should fall with the number of
ranks. Ranks run under ``torchrun`` (gloo on this machine) and build the manifest with
``ckptpub.distributed.DistributedHasher`` (the mounts are read-only, so nothing is
written; writing the manifest is one small file on rank 0). Reads use ``pread``
(``use_mmap=False``), the setting for network filesystems. Every run's identity is
checked against a single-process build of the local folder.

    python benchmarks/bench_distributed_publish.py [--mb 400] [--shards 8] [--mbps 100] [--ranks 1 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

# the slow filesystem lives with the tests (tests/support/slowfs.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.slowfs import SlowFS  # noqa: E402


def make_checkpoint(folder: Path, megabytes: int, shards: int) -> None:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    per_tensor = (megabytes << 20) // shards // 4
    for index in range(shards):
        tensors = {f"layers.{index}.w{j}": rng.integers(0, 255, per_tensor, dtype=np.uint8) for j in range(4)}
        save_file(tensors, str(folder / f"model-{index + 1:05d}-of-{shards:05d}.safetensors"))
    (folder / "config.json").write_text('{"model_type": "llama"}')


def worker(mount_root: str) -> None:
    """One rank: build the manifest of its own mount; rank 0 prints seconds and identity as JSON."""
    import torch.distributed as dist

    import ckptpub
    from ckptpub.distributed import env_world, init_from_env

    world = env_world()
    hasher = init_from_env() if world else None
    rank = world[0] if world else 0
    folder = os.path.join(mount_root, f"rank{rank}")
    if hasher is not None:
        dist.barrier()
    started = time.perf_counter()
    manifest = ckptpub.build_manifest(folder, use_mmap=False, hasher=hasher)
    seconds = time.perf_counter() - started
    if rank == 0:
        print(json.dumps({"seconds": seconds, "identity": manifest.identity}), flush=True)


def run(ranks: int, source: Path, mounts: Path, mbps: float) -> dict[str, object]:
    filesystems = [
        SlowFS(str(source), str(mounts / f"rank{rank}"), latency_s=0.0, bandwidth_bps=mbps * 1e6)
        for rank in range(ranks)
    ]
    for fs in filesystems:
        fs.start()
    try:
        # --standalone: torchrun picks its own free port for the ranks to meet
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(ranks),
        ]
        command += [__file__, "--worker", str(mounts)]
        done = subprocess.run(
            command, capture_output=True, text=True, check=True, env=dict(os.environ, OMP_NUM_THREADS="1")
        )
    finally:
        for fs in filesystems:
            fs.close()
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=400)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--mbps", type=float, default=100.0, help="cap per mount, MB/s (10^6 bytes)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3, help="runs per rank count (the median is shown)")
    parser.add_argument("--worker", metavar="MOUNT_ROOT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    import ckptpub

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp, "checkpoint")
        make_checkpoint(source, args.mb, args.shards)
        expected = ckptpub.build_manifest(source).identity
        size = sum(p.stat().st_size for p in source.iterdir())
        print(
            f"checkpoint: {size / 1e6:.0f} MB in {args.shards} shards; "
            f"cap {args.mbps:.0f} MB/s per rank's mount"
        )
        print(f"median of {args.rounds} runs (fresh mounts each); load average {os.getloadavg()[0]:.1f}")
        print("| ranks | publish (s) | MB/s | speed-up | identity = single-process |")
        print("|---|---|---|---|---|")
        first = None
        for ranks in args.ranks:
            results = [
                run(ranks, source, Path(tmp, f"mounts-{ranks}-{i}"), args.mbps) for i in range(args.rounds)
            ]
            seconds = statistics.median(float(r["seconds"]) for r in results)  # type: ignore[arg-type]
            first = first or seconds
            same = "yes" if all(r["identity"] == expected for r in results) else "NO"
            print(
                f"| {ranks} | {seconds:.2f} | {size / 1e6 / seconds:.0f} | {first / seconds:.2f}x | {same} |"
            )


if __name__ == "__main__":
    main()
