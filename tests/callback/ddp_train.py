"""Run under ``torchrun --nproc_per_node 2``: train the tiny model with DDP (gloo, CPU)
and PublishCallback; each rank writes what it published to OUT/rank-{rank}.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cbhelpers  # noqa: E402,F401  (puts examples/ on sys.path)
import train_tiny  # noqa: E402

from ckptpub.callback import PublishCallback  # noqa: E402


def main(out: str) -> None:
    cb = PublishCallback()
    trainer = train_tiny.make_trainer(
        out, callbacks=[cb], max_steps=12, save_steps=4, ddp_backend="gloo", logging_steps=100
    )
    trainer.train()
    rank = int(os.environ.get("RANK", "0"))
    report = {
        "rank": rank,
        "world_size": trainer.args.world_size,
        "should_save": trainer.args.should_save,
        "published": [p.step for p in cb.published],
        "failures": cb.failures,
    }
    Path(out, f"rank-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
