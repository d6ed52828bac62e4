"""The least any publish of a 100k-tensor checkpoint costs in Python, beside what ``ckptpub publish`` costs.

Whatever its code, a publish must decode every safetensors header and the index
(JSON: the standard library's decoder), make one BLAKE3 call per tensor (each tensor
has a digest of its own) and encode the manifest's entries (JSON again). This script
does exactly that and nothing more (no check of any rule, no record, no file
written) on the checkpoint of ``make_moe_checkpoint.py``, in a fresh process each
time, once in one process and once spread over two forked processes (the shards
split between them, the index decoded meanwhile), and runs ``ckptpub publish`` of
the same folder beside them, interleaved. Median wall time and CPU time (user +
system, ``wait4``) of each; ratios to ``ckptpub publish``. If the floor is near or
above a target, no change of ckptpub's code reaches it on that machine.

    python benchmarks/bench_floor.py [--work /tmp/bench-scale] [--folder /tmp/moe] [--repeat 5]
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import mmap
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import blake3

HERE = Path(__file__).resolve().parent


def decode_and_hash(shards: list[str]) -> list[tuple[str, str, list[int], str]]:
    """Each tensor of ``shards`` as a model entry: its header decoded by ``json``, its bytes by BLAKE3."""
    entries = []
    for path in shards:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length).decode())
            mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        header.pop("__metadata__", None)
        view, start = memoryview(mapping), 8 + length
        for name, entry in header.items():
            begin, end = entry["data_offsets"]
            digest = blake3.blake3(view[start + begin : start + end]).hexdigest()
            entries.append((name, entry["dtype"], entry["shape"], digest))
        view.release()
        mapping.close()
    return entries


def floor_publish(folder: Path, processes: int) -> None:
    """Decode, hash and encode as a publish must, in ``processes`` processes; nothing checked or written."""
    shards = sorted(str(p) for p in folder.glob("*.safetensors"))
    parts = [shards[i::processes] for i in range(processes)]
    if processes == 1:
        entries = decode_and_hash(shards)
        json.loads((folder / "model.safetensors.index.json").read_bytes().decode())
    else:
        with ProcessPoolExecutor(processes, mp_context=get_context("fork")) as pool:
            pending = [pool.submit(decode_and_hash, part) for part in parts]
            json.loads((folder / "model.safetensors.index.json").read_bytes().decode())
            entries = [entry for future in pending for entry in future.result()]
    entries.sort()
    model = json.dumps(entries, ensure_ascii=False, separators=(",", ":")).encode()
    blake3.blake3(model).digest()


def timed(command: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, ``wait4``) of ``command`` in a fresh process."""
    with tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            errors.seek(0)
            sys.exit(f"bench: {' '.join(command)} failed: {errors.read().decode()[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench-scale")
    parser.add_argument("--folder", type=Path, help="a synthetic checkpoint (make_moe_checkpoint.py)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--floor", type=int, choices=(1, 2), help=argparse.SUPPRESS)  # a timed child run
    args = parser.parse_args()
    if args.floor:
        floor_publish(args.folder, args.floor)
        return
    folder = args.folder or args.work / "moe"
    if not (folder / "config.json").exists():
        subprocess.run([sys.executable, str(HERE / "make_moe_checkpoint.py"), str(folder)], check=True)
    # Bytecode as a pip install leaves it (an editable install, or PYTHONDONTWRITEBYTECODE, has none).
    compileall.compile_dir(os.path.dirname(importlib.util.find_spec("ckptpub").origin), quiet=1)
    me = [sys.executable, str(Path(__file__).resolve())]
    commands = {
        "python -c pass (the interpreter's start)": [sys.executable, "-c", "pass"],
        "floor: decode, hash, encode; one process": [*me, "--folder", str(folder), "--floor", "1"],
        "floor: the same over two processes": [*me, "--folder", str(folder), "--floor", "2"],
        "ckptpub publish": [sys.executable, "-m", "ckptpub", "publish", str(folder)],
    }
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(args.repeat):  # interleaved, so a burst of load hits every row alike
        for name, command in commands.items():
            runs[name].append(timed(command))
    tensors = len(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"])
    print(
        f"{tensors} tensors in {len(list(folder.glob('*.safetensors')))} shards; median of {args.repeat}; "
        f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}; {os.cpu_count()} CPUs"
    )
    reference = statistics.median(wall for wall, _ in runs["ckptpub publish"])
    print("| run | median wall (s) | x ckptpub publish | median CPU (s) |")
    print("|---|---|---|---|")
    for name, results in runs.items():
        wall = statistics.median(w for w, _ in results)
        cpu = statistics.median(c for _, c in results)
        print(f"| {name} | {wall:.3f} | {wall / reference:.2f} | {cpu:.3f} |")


if __name__ == "__main__":
    main()
