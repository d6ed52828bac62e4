"""Run under ``torchrun --nproc_per_node 2``: train the tiny model with DDP (gloo, CPU)
and PublishCallback; each rank writes what it published to OUT/rank-{rank}.json.

``train_tiny`` is found through the ``PYTHONPATH`` that tests/conftest.py exports to the
scripts the tests start (by hand: ``PYTHONPATH=examples``)."""

from __future__ import annotations

import sys

import train_tiny
from cbhelpers import write_rank_report

from ckptpub import PublishCallback


def main(out: str) -> None:
    cb = PublishCallback()
    trainer = train_tiny.make_trainer(
        out, callbacks=[cb], max_steps=12, save_steps=4, ddp_backend="gloo", logging_steps=100
    )
    trainer.train()
    write_rank_report(out, trainer, cb)


if __name__ == "__main__":
    main(sys.argv[1])
