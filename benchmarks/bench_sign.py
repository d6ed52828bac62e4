"""Benchmark: what signing costs at publish time, and what the signature check costs at serve time.

On the Llama-shaped checkpoint of ``bench_hash.py`` (built once, reused), warm page cache:

* ``ckptpub publish DIR`` against ``ckptpub publish DIR --sign KEY`` (SHA-256 of every file in
  the BLAKE3 read pass, then an ECDSA signature), and ``model_signing sign key`` on the same
  folder for reference; rounds interleaved, order rotated, median wall time;
* the serve-time check (``ckptpub.signing.check_signature``: ``model.sig``, the key and
  ``ckptpub.json``, no shard read) in a warm process, and in a fresh one (interpreter start
  and the ``model_signing`` import included, what an engine start pays once).

    python benchmarks/bench_sign.py [--dir /tmp/ckptpub-bench-sign] [--rounds 5] [--gb 2.1]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_hash import build_checkpoint
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

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


def make_key(folder: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / "bench-key.pem", folder / "bench-key.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/ckptpub-bench-sign"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gb", type=float, default=2.1)
    parser.add_argument("--checks", type=int, default=50, help="warm signature checks per process")
    parser.add_argument("--check-only", action="store_true", help="only the serve-time check (folder signed)")
    args = parser.parse_args()
    folder = args.dir / "checkpoint"
    build_checkpoint(folder, args.gb)
    private, public = make_key(args.dir)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name != "model.sig")
    bin_dir = Path(sys.executable).parent
    commands = {
        "ckptpub publish": [str(bin_dir / "ckptpub"), "publish", str(folder)],
        "ckptpub publish --sign": [str(bin_dir / "ckptpub"), "publish", str(folder), "--sign", str(private)],
        "model_signing sign key": [
            str(bin_dir / "model_signing"), "sign", "key", str(folder),
            "--signature", str(folder / "model.sig"), "--private_key", str(private),
        ],
    }  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in commands}
    names = list(commands)
    if not args.check_only:
        timed(commands["ckptpub publish"])  # warm the page cache
        for round_ in range(args.rounds):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                times[name].append(timed(commands[name]))
        print(f"checkpoint: {size / 1e9:.2f} GB in {folder}, {args.rounds} rounds, median wall")
        print("| command | wall (s) | GB/s | vs publish |")
        print("|---|---|---|---|")
        base = statistics.median(times["ckptpub publish"])
        for name in names:
            median = statistics.median(times[name])
            print(f"| `{name}` | {median:.2f} | {size / 1e9 / median:.2f} | {median / base:.2f}x |")
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
