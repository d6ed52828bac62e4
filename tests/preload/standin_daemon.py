"""A stand-in for ``vllm preload`` on machines without CUDA (vLLM's daemon needs CUDA IPC).

Behaves like the real launcher as far as the supervisor can tell:

* takes ``--model DIR`` and ``--weight-cache-socket-dir DIR`` (other arguments are
  accepted and recorded, like the user's pass-through arguments);
* computes its weight-cache key **in this process** with the plugin's
  ``ckptpub_vllm.key.checkpoint_key`` (what ``hash_checkpoint`` is patched to in a
  real daemon) and logs the line the plugin's daemon wrapper logs;
* "loads" for ``STANDIN_LOAD_S`` seconds, then takes an exclusive lock in the socket
  directory for its lifetime (as vLLM's daemon takes its per-GPU lock, so a second
  daemon on the same socket directory fails), then logs vLLM's READY line;
* serves until ``SIGTERM``/``SIGINT``, then exits 0.

It appends what it did to ``STANDIN_RECORD`` (JSON lines: start, ready, stop, fail),
which the tests read. ``STANDIN_FAIL`` (comma-separated identities) makes it fail
while loading those; ``STANDIN_CRASH_AFTER_S`` makes it exit 9 that long after READY
(once per identity when ``STANDIN_CRASH_ONCE`` names a marker directory).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import sys
import time

from ckptpub._filesystem import jsonfiles


def record(event: str, **data) -> None:
    path = os.environ.get("STANDIN_RECORD")
    if not path:
        return
    entry = {"event": event, "pid": os.getpid(), "time": time.time(), **data}
    jsonfiles.append_line(path, entry, os.path.basename(path))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--weight-cache-socket-dir", default=None)
    args, rest = parser.parse_known_args()

    stopping = {"flag": False}

    def on_term(signum, frame):
        stopping["flag"] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    from ckptpub_vllm.key import checkpoint_key  # the key is computed here, in the daemon process

    try:
        identity = checkpoint_key(args.model)
    except Exception as error:  # noqa: BLE001 - report like a daemon would, then exit non-zero
        print(f"ERROR weight cache daemon failed: {type(error).__name__}: {error}", flush=True)
        record("fail", folder=args.model, error=str(error))
        return 3
    record(
        "start",
        folder=args.model,
        identity=identity,
        ppid=os.getppid(),
        extra=rest,
        socket_dir=args.weight_cache_socket_dir,
        key_function=f"{checkpoint_key.__module__}.{checkpoint_key.__name__}",
        env_identity=os.environ.get("CKPTPUB_PRELOAD_IDENTITY"),
    )
    print(
        f"INFO [daemon.py:81] ckptpub: weight-cache daemon for {args.model} "
        f"is keyed by checkpoint {identity}",
        flush=True,
    )

    deadline = time.monotonic() + float(os.environ.get("STANDIN_LOAD_S", "0.2"))
    while time.monotonic() < deadline and not stopping["flag"]:
        time.sleep(0.02)
    if stopping["flag"]:
        record("stop", identity=identity, during="load")
        return 0
    if identity in os.environ.get("STANDIN_FAIL", "").split(","):
        print("ERROR weight cache daemon: simulated load failure (CUDA out of memory)", flush=True)
        record("fail", folder=args.model, identity=identity, error="simulated")
        return 4

    lock_fd = None
    if args.weight_cache_socket_dir:
        os.makedirs(args.weight_cache_socket_dir, exist_ok=True)
        lock_fd = os.open(
            os.path.join(args.weight_cache_socket_dir, "gpu0.sock.lock"), os.O_CREAT | os.O_RDWR, 0o600
        )
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            print(
                f"ERROR Another weight cache daemon already owns {args.weight_cache_socket_dir}", flush=True
            )
            record("fail", folder=args.model, identity=identity, error="lock held")
            return 1

    print(
        "INFO ===== Weight cache daemon READY: node 0/1 serving 1 local rank(s) x 1 role(s) =====", flush=True
    )
    record("ready", folder=args.model, identity=identity)

    crash_after = os.environ.get("STANDIN_CRASH_AFTER_S")
    crash_at = time.monotonic() + float(crash_after) if crash_after else None
    marker_dir = os.environ.get("STANDIN_CRASH_ONCE")
    if crash_at is not None and marker_dir:
        marker = os.path.join(marker_dir, identity.replace(":", "_"))
        if os.path.exists(marker):
            crash_at = None
        else:
            open(marker, "w").close()
    while not stopping["flag"]:
        if crash_at is not None and time.monotonic() > crash_at:
            print("ERROR simulated crash of the weight cache daemon", flush=True)
            record("crash", identity=identity)
            os._exit(9)
        time.sleep(0.02)
    record("stop", identity=identity, during="serve")
    if lock_fd is not None:
        os.close(lock_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
