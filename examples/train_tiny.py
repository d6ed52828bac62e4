"""Train a tiny causal LM offline with ckptpub's PublishCallback (used by ``make demo``).

Why it exists: the demo needs a real Trainer run that needs no model hub and takes
seconds on two CPU cores, yet produces checkpoints vLLM's CPU engine can serve (Qwen3,
2 layers, 2 heads of dimension 64 - its CPU kernels refuse 16). The model, data and
Trainer come from ``tests/support/tiny_model.py``, the one builder the tests and
benchmarks use too (so this runs from a checkout of the repository).

    python examples/train_tiny.py OUT_DIR [--steps 40] [--save-steps 10]

Writes OUT_DIR/checkpoint-N (each with ckptpub.json), OUT_DIR/ckptpub-index.jsonl,
and the final model in OUT_DIR/final (published with ``ckptpub.publish``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tiny model's one builder
from support.tiny_model import make_trainer  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    import logging

    import ckptpub
    from ckptpub import PublishCallback

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger("ckptpub").addHandler(handler)
    logging.getLogger("ckptpub").setLevel(logging.INFO)  # one line per published checkpoint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output_dir")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--save-steps", type=int, default=10)
    ap.add_argument("--sync", action="store_true", help="publish inside on_save instead of in the background")
    a = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)  # a model this small is fastest on one thread, and robust on a busy machine
    trainer = make_trainer(a.output_dir, max_steps=a.steps, save_steps=a.save_steps)
    trainer.add_callback(PublishCallback(background=not a.sync))
    trainer.train()
    final = os.path.join(a.output_dir, "final")
    trainer.save_model(final)  # fires no callback event: publish it explicitly
    manifest = ckptpub.publish(
        final, provenance={"step": int(trainer.state.global_step), "run_dir": os.path.abspath(a.output_dir)}
    )
    print(f"final model {final}: {manifest.identity}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
