"""One rank of a distributed publish (run under ``torchrun``, or started by hand with its env).

``python dist_publish.py FOLDER OUT [--timeout S] [--stall S] [--kill]``: joins the job
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``... as torchrun sets them), publishes FOLDER
with ``ckptpub.distributed.publish_on_ranks`` and writes ``OUT/rank-N.json``: the bytes
this rank hashed, the identity or the error, and the seconds the publish took.
A ``{rank}`` in FOLDER is replaced by the rank (each rank its own view of the folder).
``--stall S``: rank 1 sleeps S seconds before publishing (a stalled node).
``--kill``: rank 1 kills itself (SIGKILL) as soon as it starts hashing (a node lost).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

from ckptpub import CkptpubError
from ckptpub.distributed import init_from_env, publish_on_ranks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("out")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--stall", type=float, default=0.0)
    parser.add_argument("--kill", action="store_true")
    args = parser.parse_args()
    hasher = init_from_env(args.timeout)
    hashed = [0]

    def progress(done: int, total: int) -> None:
        hashed[0] = done
        if args.kill and hasher.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    if args.stall and hasher.rank == 1:
        time.sleep(args.stall)
    report: dict[str, object] = {"rank": hasher.rank, "world_size": hasher.world_size}
    started = time.monotonic()
    try:
        folder = args.folder.replace("{rank}", str(hasher.rank))
        manifest = publish_on_ranks(folder, hasher, on_progress=progress)
        report["identity"] = manifest.identity
    except CkptpubError as error:
        report["error"] = str(error)
    report["seconds"] = time.monotonic() - started
    report["hashed_bytes"] = hashed[0]
    Path(args.out, f"rank-{hasher.rank}.json").write_text(json.dumps(report))
    # torch's exit-time teardown of a group whose peer died aborts the process; the report is written
    os._exit(0)


if __name__ == "__main__":
    main()
