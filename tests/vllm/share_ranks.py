"""Two real ranks (torchrun, gloo) streaming one checkpoint through ``StreamVerifier`` with peers.

``python -m torch.distributed.run --nproc_per_node 2 share_ranks.py FOLDER COPY``: every
case runs on both ranks in turn over torch's default group (the stand-in for vLLM's
tensor-parallel ``cpu_group``: the same gloo collectives), and each rank prints one
``CKPTPUB_RANK`` JSON line per case: how many tensors it hashed, how many it handed on
without copying them (``views``), and its refusal if any.
``COPY`` is a copy of ``FOLDER`` (other inodes): rank 1 reads it in the "copy" case.
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist
from ckptpub_vllm.worker.node_share import READS_ALL, READS_LISTED, Peers
from ckptpub_vllm.worker.verify_stream import TensorVerifier
from safetensors import safe_open

import ckptpub
from ckptpub.serving import RefusedError


def stream(folder: str, change: str | None = None):
    """The folder's tensors as vLLM's loader yields them; ``change``'s first element incremented."""
    for shard in ckptpub.read_manifest(folder).weights:
        with safe_open(os.path.join(folder, shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has keys() but no __iter__
                tensor = f.get_tensor(name)
                if name == change:
                    tensor = tensor.clone()
                    tensor.view(-1)[0] += 1
                yield name, tensor


def run(folder: str, case: str, peers: Peers, rank: int) -> dict:
    verifier = TensorVerifier(folder, ckptpub.read_manifest(folder), peers=peers)
    everything = sorted(verifier.expected)
    if case == "listed":  # expert parallel: rank 0 sees the even tensors, rank 1 all of them
        verifier.share(READS_LISTED, lambda name: rank == 1 or everything.index(name) % 2 == 0)
    else:
        verifier.share(READS_ALL)
    mine = verifier.mine if verifier.mine is not None else frozenset(everything)
    owned = {rank: sorted(mine), 1 - rank: sorted(set(everything) - mine)}
    change = owned[int(case[-1])][0] if case.startswith("tamper") else None
    seen = [
        (n, t) for n, t in stream(folder, change) if case != "listed" or rank == 1 or n in everything[::2]
    ]
    views = 0  # tensors handed on as the streamed tensor's own memory rather than a private copy
    try:
        for (_, streamed), (_, handed) in zip(seen, verifier.wrap(seen), strict=True):
            views += handed.untyped_storage().data_ptr() == streamed.untyped_storage().data_ptr()
        if case == "listed":
            verifier.mark_partial("expert-parallel weight filter")
        verifier.finish()
    except RefusedError as error:
        return {"case": case, "changed": change, "refused": str(error)}
    return {
        "case": case,
        "verified": verifier.verified_tensors,
        "of": verifier.total_tensors,
        "mine": sorted(mine),
        "views": views,
    }


def main() -> None:
    folder, copy = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    peers = Peers((None,))
    for case in ("clean", "tamper0", "tamper1", "copy", "listed"):
        own = copy if case == "copy" and rank == 1 else folder
        line = "CKPTPUB_RANK " + json.dumps({"rank": rank, **run(own, case, peers, rank)}) + "\n"
        sys.stdout.write(line)  # one write, newline included: print() writes it apart (PYTHONUNBUFFERED=1)
        sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
