"""A real Trainer run for ``test_real_daemon.py``, paced by the ``ckptpub preload --follow`` supervisor.

    PYTHONPATH=tests python tests/vllm/follow_train.py RUN_DIR STATE_DIR

The tiny Qwen3 of ``support.tiny_model`` with ``PublishCallback`` (synchronous, so a
checkpoint's manifest and run-index line exist when ``on_save`` returns). Saves at
steps 5, 10 and 15; the learning rate is 0 from step 11 on, so ``checkpoint-15`` holds
exactly the bytes of ``checkpoint-10`` under a new step folder (AdamW without weight
decay moves no weight at lr 0). After each save the run waits until the supervisor's
status shows that step observed and settled (``ready``, holding the target's identity,
nothing loading), so every checkpoint meets the supervisor one at a time, as in a real
run whose saves are minutes apart. Exit code 3 when the supervisor does not settle.
``support.tiny_model`` is found through the ``PYTHONPATH`` that tests/conftest.py exports to the
scripts the tests start (by hand: ``PYTHONPATH=tests``).
"""

from __future__ import annotations

import json
import os
import sys
import time

SETTLE_TIMEOUT_S = 900  # a daemon start on a heavily loaded machine
FROZEN_AFTER_STEP = 10


def settled(state_dir: str, step: int) -> bool:
    """Whether the supervisor holds step ``step``'s identity; exits (3) when it reports a failure."""
    try:
        with open(os.path.join(state_dir, "status.json")) as handle:
            status = json.load(handle)
    except (OSError, ValueError):
        return False
    if status.get("state") == "failed":
        print(
            f"follow_train: the supervisor failed at step {step}: {status.get('last_error')}", file=sys.stderr
        )
        sys.exit(3)
    target, held = status.get("target") or {}, status.get("held") or {}
    return (
        status.get("state") == "ready"
        and target.get("step") == step
        and not status.get("loading")
        and held.get("identity") == target.get("identity")
    )


def main(run_dir: str, state_dir: str) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from support import tiny_model
    from transformers import TrainerCallback

    from ckptpub import PublishCallback

    class FreezeAfter(TrainerCallback):
        """lr 0 after FROZEN_AFTER_STEP: later checkpoints re-save the same weights."""

        def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
            if state.global_step >= FROZEN_AFTER_STEP:
                for group in optimizer.param_groups:
                    group["lr"] = 0.0

    class WaitForSupervisor(TrainerCallback):
        """Runs after PublishCallback: the checkpoint is published; wait for the supervisor to act on it."""

        def on_save(self, args, state, control, **kwargs):
            deadline = time.monotonic() + SETTLE_TIMEOUT_S
            while not settled(state_dir, state.global_step):
                if time.monotonic() > deadline:
                    print(
                        f"follow_train: supervisor did not settle on step {state.global_step}",
                        file=sys.stderr,
                    )
                    sys.exit(3)
                time.sleep(0.2)
            print(f"follow_train: supervisor settled on step {state.global_step}", flush=True)

    torch.set_num_threads(1)
    trainer = tiny_model.make_trainer(
        run_dir, max_steps=15, save_steps=5, weight_decay=0.0, lr_scheduler_type="constant"
    )
    for callback in (FreezeAfter(), PublishCallback(background=False), WaitForSupervisor()):
        trainer.add_callback(callback)
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
