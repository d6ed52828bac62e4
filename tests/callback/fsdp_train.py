"""Run under ``torchrun --nproc_per_node 2``: train the tiny model with the Trainer's FSDP
(FSDP2, gloo, CPU) and PublishCallback; each rank writes what it published to OUT/rank-{rank}.json.

    fsdp_train.py OUT STATE_DICT_TYPE   (SHARDED_STATE_DICT or FULL_STATE_DICT)

FSDP on CPU: the Trainer passes its ``FullyShardedDataParallelPlugin`` to accelerate,
and accelerate 1.15 keeps it only on accelerator devices: ``AcceleratorState.__init__``
(accelerate/state.py, the ``elif self.distributed_type in [DistributedType.MULTI_GPU, ...]``
branch that sets ``DistributedType.FSDP``) does not list ``MULTI_CPU``, so on CPU the
plugin is silently dropped and the Trainer trains with DDP. ``enable_fsdp_on_cpu`` sets
the state that branch would have set; from there on everything is the real thing:
accelerate shards the model with torch's ``fully_shard`` (gloo on CPU) and the Trainer
saves through accelerate's ``save_fsdp_model``/``save_fsdp_optimizer``. FSDP1
(``fsdp_config["version"] = 1``) cannot run on CPU at all: its plugin raises "There are
currently no available devices found" (accelerate/utils/dataclasses.py, ``__post_init__``).

``support.tiny_model`` is found through the ``PYTHONPATH`` that tests/conftest.py exports to the
scripts the tests start (by hand: ``PYTHONPATH=tests``)."""

from __future__ import annotations

import sys
from typing import Any

from cbhelpers import write_rank_report
from support import tiny_model

from ckptpub import PublishCallback


def enable_fsdp_on_cpu(trainer: Any) -> None:
    """Keep the FSDP plugin accelerate dropped because the job runs on CPU (see the module doc)."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = trainer.accelerator.state
    if getattr(state, "fsdp_plugin", None) is None:
        state.fsdp_plugin = FullyShardedDataParallelPlugin(**trainer.args.fsdp_plugin_args)
        state.distributed_type = DistributedType.FSDP
        # every later AcceleratorState() copies PartialState's shared state over its own (state.py, __init__)
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        trainer.is_fsdp_enabled = True


def main(out: str, state_dict_type: str) -> None:
    import torch

    torch.set_num_threads(1)
    cb = PublishCallback()
    trainer = tiny_model.make_trainer(
        out,
        callbacks=[cb],
        max_steps=6,
        save_steps=3,
        ddp_backend="gloo",
        logging_steps=100,
        fsdp=True,
        # FSDP2 (the only FSDP that runs on CPU); reshard_after_forward: full_shard
        fsdp_config={"version": 2, "reshard_after_forward": True, "state_dict_type": state_dict_type},
    )
    enable_fsdp_on_cpu(trainer)
    trainer.train()
    write_rank_report(
        out,
        trainer,
        cb,
        model_class=type(trainer.model_wrapped).__name__,
        distributed_type=trainer.accelerator.distributed_type.value,
        process_groups=len(torch.distributed.distributed_c10d._world.pg_map),  # the callback's is closed
    )
    end_of_job(trainer)


def end_of_job(trainer: Any) -> None:
    """End as a distributed script should (``Trainer.end``, transformers' documented last call): every
    rank past a barrier, then the Trainer's process group destroyed, so no group is left to the
    interpreter's exit, whose teardown on a rank whose peer has already exited can abort it."""
    import torch.distributed as dist

    dist.barrier()
    trainer.end()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
