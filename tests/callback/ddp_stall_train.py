"""Run under ``torchrun --nproc_per_node 2``: the tiny model with DDP (gloo) and
PublishCallback(rank_timeout_s=TIMEOUT), where rank 1 is a stalled node: its part of
every distributed hash starts STALL seconds late (the one thing this script changes,
in its own process). Each rank writes OUT/rank-{rank}.json: what it published (with
how many ranks hashed it) and its warnings.

    python ddp_stall_train.py OUT STALL TIMEOUT
"""

from __future__ import annotations

import os
import sys
import time

from cbhelpers import write_rank_report
from support import tiny_model

from ckptpub import PublishCallback, distributed


def stall_rank_1(seconds: float) -> None:
    hash_on_ranks = distributed.DistributedHasher._hash  # both span_digests and file_digests call it

    def late(self: distributed.DistributedHasher, *args: object, **kwargs: object) -> object:
        time.sleep(seconds)
        return hash_on_ranks(self, *args, **kwargs)  # type: ignore[arg-type]

    distributed.DistributedHasher._hash = late  # type: ignore[method-assign]


def main(out: str, stall: float, timeout: float) -> None:
    rank = int(os.environ.get("RANK", "0"))
    if rank == 1:
        stall_rank_1(stall)
    cb = PublishCallback(rank_timeout_s=timeout)
    trainer = tiny_model.make_trainer(
        out, callbacks=[cb], max_steps=12, save_steps=4, ddp_backend="gloo", logging_steps=100
    )
    started = time.monotonic()
    trainer.train()
    write_rank_report(out, trainer, cb, train_seconds=time.monotonic() - started)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
