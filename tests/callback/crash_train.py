"""Train until killed: a ~50 MB checkpoint (weights + optimizer) every 3 steps with
PublishCallback in background mode. The crash-safety test SIGKILLs it mid-publish.

``support.tiny_model`` is found through the ``PYTHONPATH`` that tests/conftest.py exports to the
scripts the tests start (by hand: ``PYTHONPATH=tests``)."""

from __future__ import annotations

import sys

from support import tiny_model

from ckptpub import PublishCallback

if __name__ == "__main__":
    model = tiny_model.build_model(
        hidden_size=384, intermediate_size=1024, num_attention_heads=6, num_key_value_heads=6
    )
    trainer = tiny_model.make_trainer(
        sys.argv[1],
        model=model,
        callbacks=[PublishCallback()],
        max_steps=300,
        save_steps=3,
        logging_steps=1000,
        per_device_train_batch_size=2,
    )
    trainer.train()
