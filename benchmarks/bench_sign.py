"""Benchmark: what signing costs at publish time, and what the signature check costs at serve time.

On the Llama-shaped checkpoint of ``bench_hash.py`` (built once, reused), warm page cache:

* ``ckptpub publish DIR`` against ``ckptpub publish DIR --sign KEY`` (SHA-256 of every file in
  the BLAKE3 read pass, then an ECDSA signature), ``--sign KEY --sign-hash blake3`` (a
  whole-file BLAKE3 instead), and ``model_signing sign key`` on the same folder for
  reference; rounds interleaved, order rotated, median wall and CPU time (``wait4``);
  with ``--cold``, each run after the checkpoint's pages are dropped
  (``posix_fadvise(POSIX_FADV_DONTNEED)``, as ``bench_hash.py`` does), where reading
  the disk, not hashing, sets the pace;
* in one process with the key loaded once (as ``PublishCallback`` loads it when training starts,
  so no save pays for importing ``model_signing``): ``ckptpub.publish(DIR)`` against
  ``publish(DIR, sign=signer, sign_hash=...)`` for both hashes, interleaved, median;
* the bytes each way of publishing reads (``/proc/self/io`` ``rchar`` around the hashing,
  in-process, reading with ``pread`` so that every byte read is counted): signing must
  read no byte twice;
* the serve-time check (``ckptpub.signing.check_signature``: ``model.sig``, the key and
  ``ckptpub.json``, no shard read) in a warm process, and in a fresh one (interpreter start
  and the ``model_signing`` import included, what an engine start pays once).

    python benchmarks/bench_sign.py [--dir /tmp/ckptpub-bench-sign] [--rounds 5] [--gb 2.1] [--cold]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_hash import build_checkpoint, drop_pages

# the signing key's one maker lives with the tests (tests/support/signhelpers.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.signhelpers import make_key  # noqa: E402

CHECK = (
    "import sys, time, ckptpub; t0 = time.perf_counter(); from ckptpub import signing; "
    "check = signing.check_signature(sys.argv[1], signing.TrustedKey(public_key=sys.argv[2])); "
    "assert check.ok, check.problems; t1 = time.perf_counter(); "
    "times = []\n"
    "for _ in range(int(sys.argv[3])):\n"
    "    s = time.perf_counter(); assert signing.check_signature(sys.argv[1], "
    "signing.TrustedKey(public_key=sys.argv[2])).ok; times.append(time.perf_counter() - s)\n"
    "reads = []\n"
    "for _ in range(int(sys.argv[3])):\n"
    "    s = time.perf_counter(); ckptpub.read_manifest(sys.argv[1]); reads.append(time.perf_counter() - s)\n"
    "times.sort(); reads.sort(); print(t1 - t0, times[len(times) // 2], reads[len(reads) // 2])"
)


READS = """
import sys
from ckptpub import read_manifest
from ckptpub._hashing.engine import Span, hash_files, hash_spans

def read_bytes():
    with open("/proc/self/io") as io:
        return int(next(line for line in io if line.startswith("rchar:")).split()[1])

folder = sys.argv[1]
manifest = read_manifest(folder)
spans = []
for record in manifest.files:
    path = f"{folder}/{record.path}"
    header = record.header_size or record.size
    spans.append(Span(path, 0, header, record.path))
    if record.header_size is not None:
        spans += [Span(path, header + t.data_offsets[0], header + t.data_offsets[1], t.name)
                  for t in manifest.tensors if t.file == record.path]
for name, run in (("publish", lambda: hash_spans(spans, use_mmap=False)),
                  ("sign sha256", lambda: hash_files(spans, "sha256", use_mmap=False)),
                  ("sign blake3", lambda: hash_files(spans, "blake3", use_mmap=False))):
    before = read_bytes()
    run()
    print(name, read_bytes() - before, sum(r.size for r in manifest.files))
"""


IN_PROCESS = """
import statistics, sys, time
import ckptpub
from ckptpub.signing import Signer
folder, key, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
signer = Signer.load(key)
runs = {"publish": {}, "publish(sign=signer)": {"sign": signer},
        "publish(sign=signer, sign_hash='blake3')": {"sign": signer, "sign_hash": "blake3"}}
times = {name: [] for name in runs}
for round_ in range(rounds):
    for name, options in runs.items():
        start = time.perf_counter()
        ckptpub.publish(folder, **options)
        times[name].append(time.perf_counter() - start)
for name, values in times.items():
    print(statistics.median(values), name)
"""


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one run."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"bench: {' '.join(argv)} failed")
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime


def in_process(folder: Path, private: Path, rounds: int) -> None:
    print()
    print("| in one process, key loaded once (as PublishCallback) | wall (s) | vs publish |")
    print("|---|---|---|")
    lines = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, str(folder), str(private), str(rounds)],
        check=True, capture_output=True, text=True,
    ).stdout.splitlines()  # fmt: skip
    base = float(lines[0].split()[0])
    for line in lines:
        seconds, label = line.split(" ", 1)
        print(f"| `{label}` | {float(seconds):.2f} | {float(seconds) / base:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/ckptpub-bench-sign"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gb", type=float, default=2.1)
    parser.add_argument("--checks", type=int, default=50, help="warm signature checks per process")
    parser.add_argument("--check-only", action="store_true", help="only the serve-time check (folder signed)")
    parser.add_argument(
        "--cold", action="store_true", help="drop the checkpoint's cached pages before each run"
    )
    args = parser.parse_args()
    folder = args.dir / "checkpoint"
    build_checkpoint(folder, args.gb)
    key = make_key(args.dir, "bench-key")
    private, public = key.private, key.public
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name != "model.sig")
    bin_dir = Path(sys.executable).parent
    commands = {
        "ckptpub publish": [str(bin_dir / "ckptpub"), "publish", str(folder)],
        "ckptpub publish --sign": [str(bin_dir / "ckptpub"), "publish", str(folder), "--sign", str(private)],
        "ckptpub publish --sign --sign-hash blake3": [
            str(bin_dir / "ckptpub"), "publish", str(folder), "--sign", str(private), "--sign-hash", "blake3",
        ],
        "model_signing sign key": [
            str(bin_dir / "model_signing"), "sign", "key", str(folder),
            "--signature", str(folder / "model.sig"), "--private_key", str(private),
        ],
    }  # fmt: skip
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    names = list(commands)
    if not args.check_only:
        timed(commands["ckptpub publish"])  # warm the page cache
        load = os.getloadavg()[0]
        for round_ in range(args.rounds):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                if args.cold:
                    drop_pages([str(p) for p in folder.rglob("*") if p.is_file()], drop_caches=False)
                times[name].append(timed(commands[name]))
        print(
            f"checkpoint: {size / 1e9:.2f} GB in {folder}, {args.rounds} {'cold' if args.cold else 'warm'} "
            f"rounds, median; "
            f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
        )
        print("| command | wall (s) | GB/s | wall vs publish | CPU (s) | CPU vs publish |")
        print("|---|---|---|---|---|---|")
        base_wall = statistics.median(wall for wall, _ in times["ckptpub publish"])
        base_cpu = statistics.median(cpu for _, cpu in times["ckptpub publish"])
        for name in names:
            wall = statistics.median(w for w, _ in times[name])
            cpu = statistics.median(c for _, c in times[name])
            print(
                f"| `{name}` | {wall:.2f} | {size / 1e9 / wall:.2f} | {wall / base_wall:.2f}x "
                f"| {cpu:.2f} | {cpu / base_cpu:.2f}x |"
            )
        if not args.cold:
            in_process(folder, private, args.rounds)
        print()
        print("| bytes read (pread, in-process) | bytes | x the folder's bytes |")
        print("|---|---|---|")
        reads = subprocess.run(
            [sys.executable, "-c", READS, str(folder)], check=True, capture_output=True, text=True
        ).stdout
        for line in reads.splitlines():
            *label, read, whole = line.split()
            print(f"| {' '.join(label)} | {int(read)} | {int(read) / int(whole):.4f} |")
    timed(commands["ckptpub publish --sign"])  # the folder signed with this run's key
    fresh = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", CHECK, str(folder), str(public), str(args.checks)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        fresh.append((time.perf_counter() - start, float(out[0]), float(out[1]), float(out[2])))
    print()
    print("| serve-time signature check | ms |")
    print("|---|---|")
    rows = (
        (f"warm (median of {args.checks} in one process)", 2),
        ("of which `read_manifest` (what a start without a key does too)", 3),
        ("first in a process (imports model_signing)", 1),
        ("fresh interpreter, start to exit", 0),
    )
    for label, column in rows:
        print(f"| {label} | {statistics.median(f[column] for f in fresh) * 1e3:.1f} |")


if __name__ == "__main__":
    main()
