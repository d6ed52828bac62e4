"""A plain accelerate loop (no Trainer): save_state() every 4 steps, then
publish_accelerate_state(). Run directly or under torchrun; each process writes
what the helper returned to OUT/rank-{rank}.json.

``support.tiny_model`` is found through the ``PYTHONPATH`` that tests/conftest.py exports to the
scripts the tests start (by hand: ``PYTHONPATH=tests``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from support import tiny_model

import ckptpub


def main(out: str) -> None:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    acc = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(project_dir=out, automatic_checkpoint_naming=True, total_limit=2),
    )
    model = tiny_model.build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.DataLoader(tiny_model.build_dataset(tiny_model.build_tokenizer()), batch_size=4)
    model, opt, data = acc.prepare(model, opt, data)
    results = []
    for step, batch in enumerate(data, start=1):
        acc.backward(model(**batch).loss)
        opt.step()
        opt.zero_grad()
        if step % 4 == 0:
            saved = acc.save_state()
            m = ckptpub.publish_accelerate_state(acc, provenance={"step": step})
            results.append({"step": step, "folder": str(saved), "identity": m and m.identity})
        if step == 12:
            break
    Path(out, f"rank-{acc.process_index}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
