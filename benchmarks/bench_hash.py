"""Benchmark: `ckptpub publish` and `ckptpub verify` against `b3sum` on one checkpoint, warm and cold.

Builds a Llama-shaped float32 safetensors checkpoint of about ``--gb`` GB in 4 shards
(once; reused while its marker file is there), then times, interleaved with the order
rotated each round:

* warm: ``b3sum --num-threads N`` over the checkpoint's files, ``ckptpub publish`` and
  ``ckptpub verify`` of the folder (ckptpub's default: N threads, one per CPU), page cache
  warm (how much of the checkpoint is resident is printed before and after);
* cold: the same three commands, each run preceded by dropping the checkpoint's pages
  with ``posix_fadvise(POSIX_FADV_DONTNEED)`` on every file (fsync first, so no page
  is dirty), or with ``--drop-caches`` by writing ``/proc/sys/vm/drop_caches``, which
  empties the whole machine's page cache (not for a machine others are working on);
  the output says which, and how much of the checkpoint stayed resident (``fincore``);
* ``verify()`` inside one Python process (no start-up at all), interleaved with the warm runs;
* start-up, in a table of its own: ``python -c pass``, ``ckptpub --version`` and ``ckptpub
  verify`` of a one-tensor folder (the fixed cost of a run).

Wall time and CPU time (user + system, from ``wait4``) are both shown: on a machine
that other jobs load, CPU time says more about the work done. ckptpub's bytecode is
compiled first, as ``pip install`` does. Peak anonymous memory (``RssAnon``: the
process's own memory, not mapped file pages) is sampled in one extra run of each
command, outside the timed runs, so that the sampling takes no CPU from them. Prints
Markdown tables for ``docs/performance.md``.

    python benchmarks/bench_hash.py --gb 8 --dir /tmp/bench8g [--rounds 9] [--cold-rounds 3]
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from ckptpub import read_manifest

HIDDEN, INTERMEDIATE, VOCAB = 2048, 5632, 32000
LAYER_SHAPES = {
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
SHARDS = 4
POOL_BYTES = 64 << 20
IN_PROCESS = (
    "import sys, time, ckptpub; start = time.perf_counter(); "
    "assert ckptpub.verify(sys.argv[1]).ok; print(time.perf_counter() - start)"
)
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def _size(shape: tuple[int, ...]) -> int:
    count = 4  # float32
    for dimension in shape:
        count *= dimension
    return count


class RandomBytes:
    """Bytes that neither compress nor repeat at page granularity, written fast.

    A 64 MiB pool from ``os.urandom`` read from a random offset (wrapping) for every
    piece: generating 8 GB of fresh random bytes would take minutes on two cores.
    """

    def __init__(self, seed: int) -> None:
        self._pool = memoryview(os.urandom(POOL_BYTES))
        self._offsets = random.Random(seed)

    def write(self, handle, count: int) -> None:
        while count:
            start = self._offsets.randrange(POOL_BYTES)
            piece = min(count, POOL_BYTES - start)
            handle.write(self._pool[start : start + piece])
            count -= piece


def write_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], data: RandomBytes) -> None:
    """A safetensors file streamed to disk tensor by tensor (no tensor is ever held in memory)."""
    header: dict[str, object] = {}
    offset = 0
    for name, shape in shapes.items():
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + _size(shape)]}
        offset += _size(shape)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)) + encoded)
        for shape in shapes.values():
            data.write(handle, _size(shape))


def build_checkpoint(folder: Path, target_gb: float) -> None:
    """A Llama-shaped float32 model of about ``target_gb`` GB cut into 4 shards."""
    marker = folder.parent / f"{folder.name}.complete-{target_gb}"  # outside: the folder is hashed whole
    if marker.exists():
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    layer_bytes = sum(_size(shape) for shape in LAYER_SHAPES.values())
    fixed = 2 * _size((VOCAB, HIDDEN))
    layers = max(1, round((target_gb * 1e9 - fixed) / layer_bytes))
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "lm_head.weight": (VOCAB, HIDDEN)}
    shapes["model.norm.weight"] = (HIDDEN,)
    for layer in range(layers):
        shapes.update({f"model.layers.{layer}.{key}": shape for key, shape in LAYER_SHAPES.items()})
    # Shards of about equal size, tensors in order, as transformers' max_shard_size cuts them.
    parts: list[dict[str, tuple[int, ...]]] = [{} for _ in range(SHARDS)]
    total, done = sum(_size(shape) for shape in shapes.values()), 0
    for name, shape in shapes.items():
        parts[min(SHARDS - 1, done * SHARDS // total)][name] = shape
        done += _size(shape)
    data = RandomBytes(seed=0)
    for index, part in enumerate(parts):
        write_safetensors(folder / f"model-{index + 1:05d}-of-{SHARDS:05d}.safetensors", part, data)
    (folder / "config.json").write_text(f'{{"model_type": "llama", "hidden_size": {HIDDEN}}}')
    marker.touch()


def build_tiny_checkpoint(folder: Path) -> None:
    """One small tensor and a config: a ckptpub run on it is nearly all fixed cost (start-up)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / "model.safetensors", {"weight": (16, 16)}, RandomBytes(seed=1))
    (folder / "config.json").write_text('{"model_type": "llama", "rms_norm_eps": 1e-06}')


def drop_pages(files: list[str], drop_caches: bool) -> str:
    """Drop the files' cached pages; return how, for the output."""
    for name in files:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)  # a dirty page cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if not drop_caches:
        return "posix_fadvise(POSIX_FADV_DONTNEED) on every file, not a dropped page cache"
    DROP_CACHES.write_text("1\n")
    return "writing 1 to /proc/sys/vm/drop_caches (the whole page cache) after fadvise"


def resident_bytes(files: list[str]) -> int | None:
    """Bytes of ``files`` in the page cache (util-linux ``fincore``), or None without it."""
    fincore = shutil.which("fincore")
    if not fincore:
        return None
    result = subprocess.run(
        [fincore, "--bytes", "--noheadings", "--output", "RES", *files], capture_output=True, text=True
    )
    if result.returncode != 0:
        return None
    return sum(int(line) for line in result.stdout.split())


class Run(NamedTuple):
    wall: float  # seconds
    cpu: float  # user + system seconds of the process
    stdout: str


def timed(command: list[str]) -> Run:
    """Run ``command``; its wall time, its CPU time (``wait4``'s rusage) and its output."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err)
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        if process.returncode != 0:
            sys.exit(f"bench: {' '.join(command)} failed: {err.read().decode().strip()}")
        return Run(elapsed, usage.ru_utime + usage.ru_stime, out.read().decode())


def peak_anon_mib(command: list[str]) -> float:
    """Highest ``RssAnon`` of one run of ``command``, polled every 2 ms (an untimed run)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0

    def poll() -> None:
        nonlocal peak
        while process.poll() is None:
            try:
                with open(f"/proc/{process.pid}/status") as handle:
                    for line in handle:
                        if line.startswith("RssAnon:"):
                            peak = max(peak, int(line.split()[1]))
            except OSError:
                return
            time.sleep(0.002)

    poller = threading.Thread(target=poll)
    poller.start()
    process.wait()
    poller.join()
    return peak / 1024


def interleaved(
    commands: dict[str, list[str]], rounds: int, before_each: Callable[[], None] | None = None
) -> dict[str, list[Run]]:
    """Every command once per round, the order rotated each round, so drift hits all alike."""
    runs: dict[str, list[Run]] = {name: [] for name in commands}
    names = list(commands)
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            if before_each is not None:
                before_each()
            runs[name].append(timed(commands[name]))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bench8g"))
    parser.add_argument("--gb", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=9, help="warm rounds (default: 9)")
    parser.add_argument("--cold-rounds", type=int, default=3, help="cold rounds, 0 for none (default: 3)")
    parser.add_argument(
        "--drop-caches",
        action="store_true",
        help="before each cold run also empty the machine's whole page cache (root; a machine of your own)",
    )
    args = parser.parse_args()
    b3sum = shutil.which("b3sum")
    if not b3sum:
        sys.exit("bench: b3sum is not installed (apt-get install b3sum)")
    ckptpub = str(Path(sys.executable).parent / "ckptpub")
    # Bytecode as a pip install leaves it (an editable install, or PYTHONDONTWRITEBYTECODE, has none).
    compileall.compile_dir(os.path.dirname(importlib.util.find_spec("ckptpub").origin), quiet=1)
    threads = len(os.sched_getaffinity(0))
    build_checkpoint(args.dir, args.gb)
    load_at_start = _load()
    tiny = args.dir.parent / f"{args.dir.name}-tiny"
    build_tiny_checkpoint(tiny)
    timed([ckptpub, "publish", str(tiny)])
    files = sorted(str(p) for p in args.dir.iterdir() if p.name != "ckptpub.json")
    size = sum(os.path.getsize(f) for f in files)
    commands = {
        f"b3sum --num-threads {threads}": [b3sum, "--num-threads", str(threads), *files],
        "ckptpub publish": [ckptpub, "publish", str(args.dir)],
        "ckptpub verify": [ckptpub, "verify", str(args.dir)],
    }
    startup = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "ckptpub --version": [ckptpub, "--version"],
        "ckptpub verify, 1 tensor": [ckptpub, "verify", str(tiny)],
    }
    in_process = {"verify() in-process, no start-up": [sys.executable, "-c", IN_PROCESS, str(args.dir)]}
    for command in [*commands.values(), *startup.values()]:  # warm the page cache, write the manifest
        timed(command)
    resident_before = resident_bytes(files)
    warm = interleaved({**commands, **in_process}, args.rounds)
    resident_after = resident_bytes(files)
    for name in in_process:  # the time verify() itself took, as the child printed it
        warm[name] = [run._replace(wall=float(run.stdout)) for run in warm[name]]
    started = interleaved(startup, args.rounds)
    peaks = {name: f"{peak_anon_mib(command):.1f}" for name, command in commands.items()}
    cold: dict[str, list[Run]] = {}
    how_dropped, left_resident = "", []
    if args.cold_rounds:

        def drop() -> None:
            nonlocal how_dropped
            how_dropped = drop_pages(files, args.drop_caches)
            left_resident.append(resident_bytes(files) or 0)

        cold = interleaved(commands, args.cold_rounds, before_each=drop)

    tensors = read_manifest(args.dir).tensor_count
    print(
        f"checkpoint: {args.dir} ({size / 1e9:.2f} GB, {len(files)} files, {tensors} tensors); "
        f"{args.rounds} warm and {args.cold_rounds} cold interleaved rounds; {threads} CPUs; "
        f"load average {load_at_start} at the start, {_load()} at the end"
    )
    if resident_before is not None and resident_after is not None:
        print(
            f"warm: {resident_before / size:.0%} of the checkpoint resident before the warm rounds, "
            f"{resident_after / size:.0%} after"
        )
    if cold:
        print(
            f"cold: pages dropped by {how_dropped}; at most {max(left_resident) / 1e6:.0f} MB stayed resident"
        )
    b3sum_name = next(iter(commands))
    rows = []
    for name in warm:
        row = [name, *_columns(warm[name], warm[b3sum_name], size)]
        cold_columns = _columns(cold[name], cold[b3sum_name], size) if name in cold else [""] * 6
        row += [cold_columns[0], cold_columns[3]]
        rows.append([*row, peaks.get(name, "")])
    print()
    _table(
        ["command", "warm median s", "min s", "GB/s", "vs b3sum", "CPU s", "CPU vs b3sum"]
        + ["cold median s", "cold vs b3sum", "peak anon MiB"],
        rows,
    )
    print()
    _table(
        ["start-up", "median s", "min s", "CPU s (user+sys)"],
        [_startup_row(name, runs) for name, runs in started.items()],
    )


def _startup_row(name: str, runs: list[Run]) -> list[str]:
    wall, least, _, _, cpu, _ = _columns(runs, runs, 0, digits=4)
    return [name, wall, least, cpu]


def _columns(runs: list[Run], reference: list[Run], size: int, digits: int = 3) -> list[str]:
    """median wall, min wall, GB/s, wall vs reference, median CPU, CPU vs reference."""
    wall, cpu = statistics.median(r.wall for r in runs), statistics.median(r.cpu for r in runs)
    return [
        f"{wall:.{digits}f}",
        f"{min(r.wall for r in runs):.{digits}f}",
        f"{size / wall / 1e9:.2f}" if size else "",
        f"{wall / statistics.median(r.wall for r in reference):.3f}x",
        f"{cpu:.{digits}f}",
        f"{cpu / statistics.median(r.cpu for r in reference):.3f}x",
    ]


def _load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def _table(header: list[str], rows: list[list[str]]) -> None:
    """Print a Markdown table."""
    for line in [header, ["---"] * len(header), *rows]:
        print("| " + " | ".join(line) + " |")


if __name__ == "__main__":
    main()
