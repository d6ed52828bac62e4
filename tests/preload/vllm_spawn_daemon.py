"""A launcher that spawns the plugin's real daemon entry function, as ``vllm preload`` does.

``vllm preload`` starts each daemon with ``multiprocessing`` (spawn) and
``target=_run_daemon``, which the plugin replaces by ``ckptpub_vllm.daemon.run_daemon``.
This launcher does the same with the real ``run_daemon``: in the spawned child the
plugin registers itself (patching vLLM's ``hash_checkpoint``), logs its identity line
through vLLM's logging, and then calls vLLM's ``_run_daemon``, which needs CUDA and is
replaced, in the child only, by :func:`fake_vllm_run_daemon`. The fake computes the key
the way vLLM's daemon does (``protocol.hash_checkpoint(model)``, looked up at call
time), records it, reports readiness on the queue, and serves until terminated.

Only the child imports vLLM (about 15-20 s on a loaded two-core machine).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
import time
import types


class VllmConfig:
    """Named like vLLM's: ``run_daemon`` finds the config among its arguments by class name."""

    def __init__(self, model: str) -> None:
        self.model_config = types.SimpleNamespace(model=model)


def record(event: str, **data) -> None:
    path = os.environ.get("STANDIN_RECORD")
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps({"event": event, "pid": os.getpid(), "time": time.time(), **data}) + "\n")


def fake_vllm_run_daemon(global_rank, local_rank, vllm_config, init_method, socket_dir, ready_queue, *rest):
    from vllm.model_executor.model_loader.weight_cache import protocol

    key = protocol.hash_checkpoint(vllm_config.model_config.model)  # what WeightCacheKey.from_model_config uses
    record("start", identity=key, ppid=os.getppid(), folder=vllm_config.model_config.model,
           patched=getattr(protocol.hash_checkpoint, "_ckptpub_original", None) is not None,
           key_function=f"{protocol.hash_checkpoint.__module__}.{protocol.hash_checkpoint.__name__}")
    ready_queue.put(("target", global_rank))
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    while True:
        time.sleep(0.1)


if __name__ == "__mp_main__":  # in the spawned daemon child, before the target is unpickled and run
    from vllm.model_executor.model_loader.weight_cache import daemon as _vllm_daemon

    _vllm_daemon._run_daemon = fake_vllm_run_daemon  # vLLM's own needs CUDA
    if os.environ.get("STANDIN_CHILD_LOGGING", "1") == "1":
        # what `python -m ckptpub_vllm.preload.vllm_launcher` (the default daemon command) does in each child
        from ckptpub_vllm.preload.vllm_launcher import configure_logging

        configure_logging()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--weight-cache-socket-dir")
    args, _ = parser.parse_known_args()
    from ckptpub_vllm.daemon import run_daemon  # the plugin's daemon wrapper (imports no vLLM here)

    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    proc = ctx.Process(target=run_daemon, args=(0, 0, VllmConfig(args.model), "tcp://127.0.0.1:0",
                                                args.weight_cache_socket_dir, ready, False, 0, 0),
                       name="vllm-weight-cache-target-0")
    proc.start()

    def shutdown(signum, frame):
        proc.terminate()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    while True:
        try:
            ready.get(timeout=1.0)
            break
        except Exception:  # queue.Empty
            if proc.exitcode is not None:
                print(f"Weight cache daemon rank(s) exited during startup (exitcodes=[{proc.exitcode}])", flush=True)
                return proc.exitcode or 1
    print("INFO ===== Weight cache daemon READY: node 0/1 serving 1 local rank(s) x 1 role(s) =====", flush=True)
    proc.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
