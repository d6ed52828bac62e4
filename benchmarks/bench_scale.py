"""Every ckptpub command on a 100k-tensor checkpoint: median wall time and peak RSS, with b3sum beside.

Builds the synthetic mixture-of-experts checkpoint of ``make_moe_checkpoint.py``
(98,304 bf16 tensors of 1 KiB in 163 shards) unless ``--folder`` names one, a copy
with one tensor changed (for ``diff``), and a run folder holding both (for ``ls``),
then times each command in a fresh process, ``--repeat`` times, and prints a Markdown
table. The engine's key row is the time of ``ckptpub_vllm.shared.key.checkpoint_key`` (the
manifest read, its identity recomputed and checked) inside an already started process,
as an engine pays it; its memory is that whole process's. CPU time (user + system,
``wait4``; ``process_time`` for the two in-process rows) is printed beside wall time:
on a machine shared with other jobs it varies far less. The engine load check row is
the plugin's ``TensorVerifier`` over every tensor (read beforehand, untimed): what
verification adds to a vLLM load that streams the same tensors. Peak RSS is ``wait4``'s
``ru_maxrss``, which counts the mapped shards' pages too (file-backed: the page cache,
not the process's own); peak anonymous memory (``RssAnon``, what the process itself
allocated) is sampled every 2 ms in one more run of each command. Ratios are to
``b3sum`` on the same shards. ckptpub's bytecode is compiled first, as ``pip install`` does.

    python benchmarks/bench_scale.py [--work DIR] [--folder DIR] [--repeat 5] [--against CHECKOUT]

Set PYTHONPATH to another checkout's ``src`` to measure that code instead, or pass
``--against`` another checkout to run each command with both, one right after the
other, and print their ratio: on a virtual machine whose speed drifts by a fifth
within minutes (this one), only runs that close together compare.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
CKPTPUB = [sys.executable, "-m", "ckptpub"]
KEY_SNIPPET = """
import sys, time
from ckptpub_vllm.shared.key import checkpoint_key
start, cpu = time.perf_counter(), time.process_time()
key = checkpoint_key(sys.argv[1])
print(time.perf_counter() - start, time.process_time() - cpu)
assert key and key.startswith("blake3:"), key
"""


STREAM_SNIPPET = """
import glob, sys, time
import ckptpub
from safetensors import safe_open
from ckptpub_vllm.worker.verify_stream import TensorVerifier
tensors = []
for shard in sorted(glob.glob(sys.argv[1] + "/*.safetensors")):
    with safe_open(shard, framework="pt") as handle:
        tensors.extend((name, handle.get_tensor(name)) for name in handle.keys())
manifest = ckptpub.read_manifest(sys.argv[1])
start, cpu = time.perf_counter(), time.process_time()
verifier = TensorVerifier(sys.argv[1], manifest)
for _ in verifier.wrap(tensors):
    pass
verifier.finish()
print(time.perf_counter() - start, time.process_time() - cpu)
assert verifier.verified_tensors == len(tensors)
"""


class Run(NamedTuple):
    wall: float
    cpu: float  # user + system, from wait4: on a shared machine it says more about the work than wall time
    peak_mib: float
    stdout: str


def timed(command: list[str], ok: tuple[int, ...] = (0,), env: dict[str, str] | None = None) -> Run:
    """Run ``command`` in a fresh process; wall time, CPU time and ``ru_maxrss`` from ``wait4``."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if code not in ok:
            sys.exit(f"bench: {' '.join(command)} exited {code}: {err.read().decode().strip()}")
        return Run(elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out.read().decode())


def peak_anonymous_mib(command: list[str], ok: tuple[int, ...]) -> float:
    """Run ``command`` once, sampling ``/proc/PID/status`` ``RssAnon`` every 2 ms; the largest seen."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while process.poll() is None:
        try:
            with open(f"/proc/{process.pid}/status") as status:
                anon = next((line for line in status if line.startswith("RssAnon:")), None)
            if anon is not None:
                peak = max(peak, int(anon.split()[1]))
        except OSError:
            break
        time.sleep(0.002)
    if process.wait() not in ok:
        sys.exit(f"bench: {' '.join(command)} failed")
    return peak / 1024


def cpu_flags() -> str:
    """The SIMD flags that decide BLAKE3's speed (and SHA-256's), from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as info:
            flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    except OSError:
        return "flags unknown"
    wanted = ("avx2", "avx512f", "avx512vl", "sha_ni")
    return " ".join(flag if flag in flags else f"no {flag}" for flag in wanted)


def change_one_tensor(folder: Path) -> None:
    """Flip one byte of the first tensor of the first shard (the manifest then no longer matches)."""
    shard = sorted(folder.glob("*.safetensors"))[0]
    with open(shard, "r+b") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
        header.pop("__metadata__", None)
        begin = min(entry["data_offsets"][0] for entry in header.values())
        handle.seek(8 + length + begin)
        byte = handle.read(1)
        handle.seek(8 + length + begin)
        handle.write(bytes([byte[0] ^ 0xFF]))


def prepare(work: Path, folder: Path | None) -> tuple[Path, Path, Path]:
    """The checkpoint (published), a copy with one tensor changed (published), and a run folder of both."""
    if folder is None:
        folder = work / "moe"
        if not (folder / "config.json").exists():
            subprocess.run([sys.executable, str(HERE / "make_moe_checkpoint.py"), str(folder)], check=True)
    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    base, changed = run / "checkpoint-1", run / "checkpoint-2"
    shutil.copytree(folder, base, ignore=shutil.ignore_patterns("ckptpub.json"))
    shutil.copytree(base, changed)
    change_one_tensor(changed)
    for checkpoint in (base, changed):
        timed([*CKPTPUB, "publish", str(checkpoint)])
    return base, changed, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench-scale")
    parser.add_argument("--folder", type=Path, help="an existing synthetic checkpoint (copied, not changed)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--against",
        type=Path,
        help="another checkout of ckptpub: each command runs with its code too, right after this one's",
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    # Bytecode as a pip install leaves it (an editable install, or PYTHONDONTWRITEBYTECODE, has none):
    # without it every command would compile each module it imports, about 0.1 s here, on every run.
    for package in ("ckptpub", "ckptpub_vllm"):
        compileall.compile_dir(os.path.dirname(importlib.util.find_spec(package).origin), quiet=1)
    other = None if args.against is None else checkout_environment(args.against)
    base, changed, run = prepare(args.work, args.folder)
    shards = sorted(str(p) for p in base.glob("*.safetensors"))
    commands: dict[str, tuple[list[str], tuple[int, ...]]] = {
        "b3sum (shards)": (["b3sum", "--num-threads", str(os.cpu_count() or 1), *shards], (0,)),
        "publish": ([*CKPTPUB, "publish", str(base)], (0,)),
        "verify": ([*CKPTPUB, "verify", str(base)], (0,)),
        "show": ([*CKPTPUB, "show", str(base)], (0,)),
        "diff (1 tensor changed)": ([*CKPTPUB, "diff", str(base), str(changed)], (0, 1)),
        "ls (2 checkpoints)": ([*CKPTPUB, "ls", str(run)], (0,)),
        "log (2 checkpoints)": ([*CKPTPUB, "log", str(run)], (0,)),
        "engine key (in process)": ([sys.executable, "-c", KEY_SNIPPET, str(base)], (0,)),
        "engine load check (in process)": ([sys.executable, "-c", STREAM_SNIPPET, str(base)], (0,)),
    }
    runs: dict[str, list[Run]] = {name: [] for name in commands}
    against: dict[str, list[Run]] = {name: [] for name in commands if name != "b3sum (shards)"}
    for _ in range(args.repeat):  # interleaved, so a burst of load hits every command (and checkout) alike
        for name, (command, ok) in commands.items():
            runs[name].append(timed(command, ok))
            if other is not None and name in against:
                against[name].append(timed(command, ok, other))
    anonymous = {name: peak_anonymous_mib(command, ok) for name, (command, ok) in commands.items()}
    manifest_mb = (base / "ckptpub.json").stat().st_size / 1e6
    tensors = json.loads((base / "model.safetensors.index.json").read_text())["weight_map"]
    print(
        f"{len(tensors)} tensors, {len(shards)} shards, manifest {manifest_mb:.1f} MB; "
        f"median of {args.repeat}; "
        f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}; {os.cpu_count()} CPUs "
        f"({cpu_flags()})"
    )
    reference = statistics.median(r.wall for r in runs["b3sum (shards)"])
    print("| command | median wall (s) | x b3sum | median CPU (s) | peak RSS (MiB) | peak anonymous (MiB) |")
    print("|---|---|---|---|---|---|")
    for name, results in runs.items():
        wall, cpu = medians(name, results)
        ratio = "-" if name.startswith("engine") else f"{wall / reference:.1f}"
        peak = max(r.peak_mib for r in results)
        print(f"| {name} | {wall:.3f} | {ratio} | {cpu:.3f} | {peak:.0f} | {anonymous[name]:.0f} |")
    if other is not None:
        print(f"\nThis checkout against {args.against}, each command's runs right after this one's:\n")
        print("| command | this: median wall (s) | other (s) | this / other | this / other, CPU |")
        print("|---|---|---|---|---|")
        for name, results in against.items():
            (wall, cpu), (was, was_cpu) = medians(name, runs[name]), medians(name, results)
            print(f"| {name} | {wall:.3f} | {was:.3f} | {ratio_of(wall, was)} | {ratio_of(cpu, was_cpu)} |")


def ratio_of(now: float, before: float) -> str:
    """``now / before``, or a dash where ``before`` printed as zero (a toy run of the in-process key)."""
    return f"{now / before:.2f}" if before else "-"


def medians(name: str, results: list[Run]) -> tuple[float, float]:
    """Median wall and CPU seconds; an engine row's are the figures its process printed (timed inside it)."""
    if name.startswith("engine"):
        return (
            statistics.median(float(r.stdout.split()[0]) for r in results),
            statistics.median(float(r.stdout.split()[1]) for r in results),
        )
    return statistics.median(r.wall for r in results), statistics.median(r.cpu for r in results)


def checkout_environment(checkout: Path) -> dict[str, str]:
    """The environment that runs another checkout's ckptpub and plugin (its bytecode compiled first)."""
    sources = [checkout / "src", checkout / "integrations" / "vllm" / "src"]
    for source in sources:
        if not (source.is_dir() and compileall.compile_dir(str(source), quiet=1)):
            sys.exit(f"bench: {source}: not a ckptpub checkout's sources, or they do not compile")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, sources)))


if __name__ == "__main__":
    main()
