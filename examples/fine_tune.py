"""Fine-tune a published base model with PublishCallback, so every checkpoint names its base.

Used by ``make demo``.

Why it exists: the usual job is not training from scratch but fine-tuning a model
someone published. When the base folder has a ``ckptpub.json``, each checkpoint's
manifest records ``base_identity``, and ``ckptpub diff BASE CHECKPOINT`` / ``ckptpub
log RUN`` can say how they relate. Offline: the base stands in for a downloaded model.

    python examples/fine_tune.py --init-base BASE_DIR          # a fresh tiny Qwen3 in bfloat16
    python examples/fine_tune.py BASE_DIR OUT_DIR [--steps 40] [--save-steps 10]

The fine-tune loads the base in float32 (as mixed-precision recipes do) and writes
OUT_DIR/checkpoint-N and OUT_DIR/ckptpub-index.jsonl; the final model goes to
OUT_DIR/final, published with ``base=BASE_DIR``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

# The tiny model's one builder lives with the tests (tests/support): run from a checkout.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from support import tiny_model  # noqa: E402


def init_base(folder: str) -> None:
    """The tiny model and its tokenizer, saved as a downloaded base would be (bfloat16 weights)."""
    import torch

    tiny_model.build_model().to(torch.bfloat16).save_pretrained(folder)
    tiny_model.build_tokenizer().save_pretrained(folder)
    print(f"base model written to {folder}")


def fine_tune(base: str, output_dir: str, steps: int, save_steps: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import ckptpub
    from ckptpub import PublishCallback

    torch.set_num_threads(1)  # a model this small is fastest on one thread
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    # Passed to the Trainer (not add_callback) so it runs before the console printer, whose
    # log lines then carry ckptpub/identity (docs/callback.md).
    trainer = tiny_model.make_trainer(
        output_dir,
        model=model,
        tokenizer=AutoTokenizer.from_pretrained(base),
        callbacks=[PublishCallback()],
        max_steps=steps,
        save_steps=save_steps,
        logging_steps=save_steps,
    )
    trainer.train()
    final = os.path.join(output_dir, "final")
    trainer.save_model(final)  # fires no callback event: publish it explicitly, naming its base
    manifest = ckptpub.publish(final, base=base, provenance={"step": int(trainer.state.global_step)})
    print(f"final model {final}: {manifest.identity}")


def main(argv: list[str] | None = None) -> int:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger("ckptpub").addHandler(handler)
    logging.getLogger("ckptpub").setLevel(logging.INFO)  # one line per published checkpoint, and warnings

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init-base", metavar="DIR", help="write a fresh base model to DIR and exit")
    ap.add_argument("base", nargs="?")
    ap.add_argument("output_dir", nargs="?")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--save-steps", type=int, default=10)
    a = ap.parse_args(argv)
    if a.init_base:
        init_base(a.init_base)
    elif a.base and a.output_dir:
        fine_tune(a.base, a.output_dir, a.steps, a.save_steps)
    else:
        ap.error("give --init-base DIR, or BASE_DIR OUT_DIR")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
