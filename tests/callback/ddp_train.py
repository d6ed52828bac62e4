"""Run under ``torchrun --nproc_per_node 2``: train the tiny model with DDP (gloo, CPU)
and PublishCallback; each rank writes what it published to OUT/rank-{rank}.json.

``ddp_train.py OUT MODEL`` fine-tunes ``from_pretrained(MODEL)`` (a folder or a hub id)
instead, with ``publish_base=True``: the ranks publish the base together first.

``support.tiny_model`` is found through the ``PYTHONPATH`` that tests/conftest.py exports to the
scripts the tests start (by hand: ``PYTHONPATH=tests``)."""

from __future__ import annotations

import sys

from cbhelpers import write_rank_report
from support import tiny_model

from ckptpub import PublishCallback


def main(out: str, base: str | None = None) -> None:
    model = None
    if base is not None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(base)
    cb = PublishCallback(publish_base=base is not None)
    trainer = tiny_model.make_trainer(
        out, model=model, callbacks=[cb], max_steps=12, save_steps=4, ddp_backend="gloo", logging_steps=100
    )
    trainer.train()
    write_rank_report(out, trainer, cb)


if __name__ == "__main__":
    main(*sys.argv[1:3])
