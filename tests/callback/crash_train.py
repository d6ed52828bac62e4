"""Train until killed: a ~50 MB checkpoint (weights + optimizer) every 3 steps with
PublishCallback in background mode. The crash-safety test SIGKILLs it mid-publish."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cbhelpers  # noqa: E402,F401  (puts examples/ on sys.path)
import train_tiny  # noqa: E402

from ckptpub.callback import PublishCallback  # noqa: E402

if __name__ == "__main__":
    model = train_tiny.build_model(
        hidden_size=384, intermediate_size=1024, num_attention_heads=6, num_key_value_heads=6
    )
    trainer = train_tiny.make_trainer(
        sys.argv[1],
        model=model,
        callbacks=[PublishCallback()],
        max_steps=300,
        save_steps=3,
        logging_steps=1000,
        per_device_train_batch_size=2,
    )
    trainer.train()
