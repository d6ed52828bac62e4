"""``ckptpub ls`` and ``ckptpub log`` of a long run against one step's ``show``: median wall time.

A listing should cost about one ``show`` plus milliseconds a step (issue 35 item 3:
at most 1.5x one step's ``show`` at 20 steps of 98,304 tensors). This builds the
synthetic mixture-of-experts checkpoint of ``make_moe_checkpoint.py`` at the sizes
given (or takes ``--folder``), publishes it once, and lays out a run of ``--steps``
checkpoints as the Trainer callback leaves one: ``checkpoint-N`` folders (hard links
to the published files, so a long run costs no disk) and a run index naming each
step with its identity. Each command runs in a fresh process, ``--repeat`` times,
interleaved; ``--against`` another checkout runs each one with that code too, right
after this one's, and prints the ratio (before and after, side by side in one run).

    python benchmarks/bench_listing.py [--layers 64 --experts 512 --shards 163] [--steps 20]
        [--folder DIR] [--work DIR] [--repeat 5] [--against CHECKOUT]
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_scale import CKPTPUB, HERE, Run, checkout_environment, cpu_flags, medians, ratio_of, timed

import ckptpub


def prepare(work: Path, folder: Path | None, sizes: list[str], steps: int) -> tuple[Path, Path]:
    """The published checkpoint, and a run folder of ``steps`` checkpoints of it with their run index."""
    if folder is None:
        folder = work / "moe"
        made = work / "moe.sizes"
        if not made.exists() or made.read_text() != " ".join(sizes):
            subprocess.run(
                [sys.executable, str(HERE / "make_moe_checkpoint.py"), str(folder), *sizes], check=True
            )
            made.write_text(" ".join(sizes))
    checkpoint = work / "published"
    shutil.rmtree(checkpoint, ignore_errors=True)
    shutil.copytree(folder, checkpoint, ignore=shutil.ignore_patterns("ckptpub.json"))
    timed([*CKPTPUB, "publish", str(checkpoint)])
    identity = ckptpub.read_manifest(checkpoint).identity
    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir()
    records = []
    for step in range(1, steps + 1):
        name = f"checkpoint-{step}"
        shutil.copytree(checkpoint, run / name, copy_function=os.link)
        records.append(json.dumps({"step": step, "path": name, "identity": identity, "time": float(step)}))
    (run / "ckptpub-index.jsonl").write_text("".join(line + "\n" for line in records))
    return checkpoint, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="64", help="tensors: layers x experts x 3")
    parser.add_argument("--experts", default="512")
    parser.add_argument("--shards", default="163")
    parser.add_argument("--steps", type=int, default=20, help="checkpoints in the run")
    parser.add_argument("--folder", type=Path, help="an existing synthetic checkpoint (copied, not changed)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench-listing")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--against", type=Path, help="another checkout: each command runs with its code too")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    for package in ("ckptpub", "ckptpub_vllm"):  # bytecode as a pip install leaves it (see bench_scale)
        compileall.compile_dir(os.path.dirname(importlib.util.find_spec(package).origin), quiet=1)
    other = None if args.against is None else checkout_environment(args.against)
    sizes = ["--layers", args.layers, "--experts", args.experts, "--shards", args.shards]
    checkpoint, run = prepare(args.work, args.folder, sizes, args.steps)
    commands = {
        "show (one step)": [*CKPTPUB, "show", str(checkpoint)],
        f"ls ({args.steps} steps)": [*CKPTPUB, "ls", str(run)],
        f"log ({args.steps} steps)": [*CKPTPUB, "log", str(run)],
    }
    runs: dict[str, list[Run]] = {name: [] for name in commands}
    against: dict[str, list[Run]] = {name: [] for name in commands}
    for _ in range(args.repeat):  # interleaved, so a burst of load hits every command and checkout alike
        for name, command in commands.items():
            runs[name].append(timed(command))
            if other is not None:
                against[name].append(timed(command, env=other))
    tensors = len(ckptpub.read_manifest(checkpoint).tensors)
    manifest_mb = (checkpoint / "ckptpub.json").stat().st_size / 1e6
    print(
        f"{tensors} tensors, manifest {manifest_mb:.1f} MB, {args.steps} steps; median of {args.repeat}; "
        f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}; {os.cpu_count()} CPUs ({cpu_flags()})"
    )
    show = medians("show", runs["show (one step)"])[0]
    header = "| command | median wall (s) | x this show | median CPU (s) |"
    if other is not None:
        header += " other checkout: wall (s) | x its show | this / other |"
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for name, results in runs.items():
        wall, cpu = medians(name, results)
        row = f"| {name} | {wall:.3f} | {ratio_of(wall, show)} | {cpu:.3f} |"
        if other is not None:
            was, show_before = (medians(name, against[key])[0] for key in (name, "show (one step)"))
            row += f" {was:.3f} | {ratio_of(was, show_before)} | {ratio_of(wall, was)} |"
        print(row)


if __name__ == "__main__":
    main()
