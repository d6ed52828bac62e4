"""Benchmark: what PublishCallback costs a training loop, and how soon manifests land.

Two figures, for a checkpoint of at least 500 MB (targets from issue 3):

* stall: time from ``on_save`` entry to return in background mode (target < 10 ms);
* landing: time from ``on_save`` entry until the manifest is written and indexed,
  divided by the time a synchronous ``ckptpub.publish`` of the same folder takes
  (target <= 1.3x).

Modes:

* ``direct`` (default): a Trainer-shaped folder (``model.safetensors`` of random
  float32 tensors, config, trainer_state.json) of ``--mb`` MB; the real callback's
  events are called with real ``TrainingArguments``/``TrainerState``/``TrainerControl``,
  nothing else runs, so landing vs sync isolates the callback's own overhead.
* ``trainer``: two real Trainer runs of a ~670 MB Qwen3 (save_only_model) saving
  every 2 steps, one per mode, so hashing competes with training for the CPUs as it
  would in real use; the synchronous figure is the sync run's ``on_save`` time.

    python benchmarks/bench_callback.py [--mode direct|trainer] [--mb 600] [--rounds 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the tiny model's one builder (tests/support)


def build_folder(folder: Path, mb: int) -> None:
    """~``mb`` MB of random float32 tensors in one model.safetensors plus small Trainer files."""
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    per = 4 << 20  # 4 MiB tensors, a realistic size mix is not needed for hashing throughput
    tensors = {
        f"model.layers.{i}.weight": rng.standard_normal(per // 4, dtype=np.float32).reshape(1024, -1)
        for i in range(max(1, (mb << 20) // per))
    }
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 1024}))
    (folder / "trainer_state.json").write_text("{}")


def folder_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6


def bench_direct(root: Path, mb: int, rounds: int) -> dict:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    import ckptpub
    from ckptpub import PublishCallback

    folder = root / "checkpoint-0"
    build_folder(folder, mb)
    args = TrainingArguments(output_dir=str(root), use_cpu=True, report_to="none")
    state, control = TrainerState(global_step=0, max_steps=10**9), TrainerControl()
    cb = PublishCallback()
    cb.on_train_begin(args, state, control)
    sync, stall, landing = [], [], []
    ckptpub.publish(folder)  # warm the page cache and imports
    for r in range(1, rounds + 1):
        new = root / f"checkpoint-{r}"
        os.rename(folder, new)
        folder, state.global_step = new, r
        order = ("sync", "bg") if r % 2 else ("bg", "sync")
        for what in order:
            if what == "sync":
                t = time.perf_counter()
                ckptpub.publish(folder)
                sync.append(time.perf_counter() - t)
                continue
            control.should_save = True
            cb.on_step_end(
                args, state, control
            )  # the save decision: where the callback opens its rotation window
            wall0, t0 = time.time(), time.perf_counter()
            cb.on_save(args, state, control)
            stall.append(time.perf_counter() - t0)
            cb.on_train_end(args, state, control)  # waits for the worker
            landing.append(cb.published[-1].time - wall0)
    return summarize("direct", folder_mb(folder), sync, stall, landing, cb.failures)


def bench_trainer(root: Path) -> dict:
    """Two real runs of the same job: background mode, then synchronous mode.

    The synchronous figure is the time ``on_save`` takes in the sync run: the publish
    at the same point of the same loop on the same machine, which is the fair
    reference for when a background manifest lands.
    """
    from support import tiny_model

    from ckptpub import PublishCallback

    class Timed(PublishCallback):
        def __init__(self, background: bool):
            super().__init__(background=background)
            self.entries: dict[int, float] = {}
            self.stalls: list[float] = []

        def on_save(self, args, state, control, **kwargs):
            self.entries[state.global_step] = time.time()
            t = time.perf_counter()
            super().on_save(args, state, control, **kwargs)
            self.stalls.append(time.perf_counter() - t)

    runs = {}
    for background in (True, False):
        model = tiny_model.build_model(
            vocab_size=32000,
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=16,
        )
        cb = Timed(background)
        out = root / ("background" if background else "sync")
        trainer = tiny_model.make_trainer(
            str(out),
            model=model,
            callbacks=[cb],
            max_steps=6,
            save_steps=2,
            save_only_model=True,
            per_device_train_batch_size=1,
            logging_steps=100,
        )
        trainer.train()
        runs[background] = cb
        del trainer, model
    bg, sync = runs[True], runs[False]
    landing = [p.time - bg.entries[p.step] for p in bg.published]
    return summarize(
        "trainer",
        folder_mb(Path(bg.published[-1].folder)),
        sync.stalls,
        bg.stalls,
        landing,
        bg.failures + sync.failures,
    )


def summarize(mode, mb, sync, stall, landing, failures) -> dict:
    med = statistics.median
    out = {
        "mode": mode,
        "checkpoint_mb": round(mb, 1),
        "saves": len(stall),
        "stall_ms_median": round(1e3 * med(stall), 2),
        "stall_ms_max": round(1e3 * max(stall), 2),
        "sync_publish_s_median": round(med(sync), 3),
        "landing_s_median": round(med(landing), 3),
        "landing_over_sync": round(med(landing) / med(sync), 2),
        "failures": failures,
    }
    print(f"[{mode}] checkpoint {out['checkpoint_mb']} MB, {out['saves']} saves")
    print(
        f"  on_save stall (background): median {out['stall_ms_median']} ms, max {out['stall_ms_max']} ms"
        f" (target < 10 ms)"
    )
    print(
        f"  manifest landing: median {out['landing_s_median']} s vs synchronous publish "
        f"{out['sync_publish_s_median']} s -> {out['landing_over_sync']}x (target <= 1.3x)"
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["direct", "trainer"], default="direct")
    ap.add_argument("--mb", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", help="scratch folder (default: a new temporary folder, removed afterwards)")
    ap.add_argument("--json", action="store_true", help="also print the summary as one JSON line")
    a = ap.parse_args()
    root = Path(a.dir or tempfile.mkdtemp(prefix="ckptpub-bench-cb-"))
    try:
        result = bench_direct(root, a.mb, a.rounds) if a.mode == "direct" else bench_trainer(root)
    finally:
        if not a.dir:
            shutil.rmtree(root, ignore_errors=True)
    if a.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
