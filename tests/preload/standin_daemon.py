"""A stand-in for ``vllm preload`` on machines without CUDA (vLLM's daemon needs CUDA IPC).

Behaves like the real launcher with the plugin as far as the supervisor can tell:

* takes ``--model DIR`` and ``--weight-cache-socket-dir DIR`` (default: vLLM's default
  socket folder, ``$TMPDIR/vllm_weight_cache_<uid>``); other arguments are accepted
  and recorded, like the user's pass-through arguments;
* computes its weight-cache key **in this process** with the plugin's
  ``ckptpub_vllm.shared.key.checkpoint_key`` (what ``hash_checkpoint`` is patched to in a
  real daemon) and writes the plugin's reports (``ckptpub_vllm.shared.daemon_reports``:
  keyed, verified, waiting, serving, client, handed-over);
* "loads" for ``STANDIN_LOAD_S`` seconds, then takes an exclusive lock on its socket
  path for its lifetime, as vLLM's daemon takes its per-GPU lock: held by another
  daemon, it fails, or with ``CKPTPUB_PRELOAD_TAKEOVER=1`` reports ``waiting`` and
  waits for it (the plugin's ``daemon_serving``); then binds the socket and logs
  vLLM's READY line;
* answers on its socket, with vLLM's framing: ``get_state`` (``{"status": "ok"}``,
  and a ``client`` report naming the asker's pid, as the plugin reports an engine
  handed the weights), ``ckptpub_held`` and ``ckptpub_hand_over`` (gives the path up,
  keeps running; refuses, as the plugin's daemon does, one that names another pid);
* serves until ``SIGTERM``/``SIGINT``, then exits 0.

It appends what it did to ``STANDIN_RECORD`` (JSON lines: start, ready, released, handed-over,
stop, fail), which the tests read. ``STANDIN_FAIL`` (comma-separated identities)
makes it fail while loading those; ``STANDIN_CRASH_AFTER_S`` makes it exit 9 that
long after READY (once per identity when ``STANDIN_CRASH_ONCE`` names a marker
directory); ``STANDIN_UNVERIFIED=1`` leaves the ``verified`` report out (a daemon
that loaded without checking its tensors); ``STANDIN_HANDED_OVER_DELAY_S`` writes the
``handed-over`` report that long after the path was let go (a busy machine: the real
daemon reports it after vLLM's loop released the lock, so the daemon that takes the
path over may be ready first).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import pickle
import signal
import socket
import struct
import sys
import tempfile
import time

from ckptpub._filesystem import jsonfiles

SOCKET_NAME = "vllm_weight_cache_standin.sock"


def record(event: str, **data) -> None:
    path = os.environ.get("STANDIN_RECORD")
    if not path:
        return
    entry = {"event": event, "pid": os.getpid(), "time": time.time(), **data}
    jsonfiles.append_line(path, entry, os.path.basename(path))


def take_lock(path: str, identity: str, stopping: dict) -> int | None:
    """The socket path's lock, as vLLM's daemon takes it (with the plugin's wait when taking over)."""
    from ckptpub_vllm.shared import daemon_reports

    fd = os.open(f"{path}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    waiting = False
    while not stopping["flag"]:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            if os.environ.get("CKPTPUB_PRELOAD_TAKEOVER") != "1":
                os.close(fd)
                print(f"ERROR Another weight cache daemon already owns {path}", flush=True)
                return None
            if not waiting:
                waiting = True
                daemon_reports.report(daemon_reports.WAITING, identity=identity, socket=path)
            time.sleep(0.05)
    os.close(fd)
    return None


def read_message(conn: socket.socket) -> dict | None:
    """One message framed as vLLM's ``send_msg`` frames it; None when the peer closed first."""
    header = conn.recv(8, socket.MSG_WAITALL)
    if len(header) < 8:
        return None
    (size,) = struct.unpack("!Q", header)
    return pickle.loads(conn.recv(size, socket.MSG_WAITALL))  # test code: the peer is the test's own


def answer(conn: socket.socket, identity: str, folder: str) -> str | None:
    """Answer one request; returns its command."""
    from ckptpub_vllm.shared import daemon_reports

    request = read_message(conn)
    if request is None:
        return None
    command = request.get("cmd")
    if command == daemon_reports.HELD_COMMAND:
        reply = {"status": "ok", "key": {"checkpoint": identity}, "folder": folder, "released": False}
    elif command == daemon_reports.HAND_OVER_COMMAND and request.get("pid") != os.getpid():
        record("hand-over-refused", identity=identity, asked=request.get("pid"))
        reply, command = {"status": "error", "message": f"this daemon is pid {os.getpid()}"}, None
    else:
        reply = {"status": "ok"}
    payload = pickle.dumps(reply)
    with contextlib.suppress(OSError):
        conn.sendall(struct.pack("!Q", len(payload)) + payload)
    if command == "get_state":
        pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        with open(f"/proc/{pid}/stat") as handle:
            start = int(handle.read().rsplit(")", 1)[1].split()[19])
        daemon_reports.report(daemon_reports.CLIENT, client_pid=pid, client_start=start)
    return command


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

    from ckptpub_vllm.shared import daemon_reports
    from ckptpub_vllm.shared.key import checkpoint_key  # the key is computed here, in the daemon process

    daemon_reports.enable()
    try:
        identity = checkpoint_key(args.model)
    except Exception as error:  # noqa: BLE001 - report like a daemon would, then exit non-zero
        print(f"ERROR weight cache daemon failed: {type(error).__name__}: {error}", flush=True)
        record("fail", folder=args.model, error=str(error))
        return 3
    socket_dir = args.weight_cache_socket_dir or os.path.join(
        tempfile.gettempdir(), f"vllm_weight_cache_{os.getuid()}"
    )
    record(
        "start",
        folder=args.model,
        identity=identity,
        ppid=os.getppid(),
        extra=rest,
        socket_dir=socket_dir,
        key_function=f"{checkpoint_key.__module__}.{checkpoint_key.__name__}",
        env_identity=os.environ.get("CKPTPUB_PRELOAD_IDENTITY"),
    )
    daemon_reports.report(daemon_reports.KEYED, folder=args.model, identity=identity)

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
    if os.environ.get("STANDIN_UNVERIFIED") != "1":
        daemon_reports.report(daemon_reports.VERIFIED, folder=args.model, identity=identity, tensors=0)

    os.makedirs(socket_dir, mode=0o700, exist_ok=True)
    path = os.path.join(socket_dir, SOCKET_NAME)
    lock_fd = take_lock(path, identity, stopping)
    if lock_fd is None:
        if stopping["flag"]:
            record("stop", identity=identity, during="wait")
            return 0
        record("fail", folder=args.model, identity=identity, error="lock held")
        return 1
    daemon_reports.report(daemon_reports.SERVING, identity=identity, socket=path)
    if os.path.lexists(path):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    server.settimeout(0.05)
    print(
        "INFO ===== Weight cache daemon READY: node 0/1 serving 1 local rank(s) x 1 role(s) =====", flush=True
    )
    record("ready", folder=args.model, identity=identity, socket=path)

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
        if server is None:
            time.sleep(0.02)
            continue
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        with conn:
            command = answer(conn, identity, args.model)
        if command == daemon_reports.HAND_OVER_COMMAND:
            server.close()
            server = None
            os.unlink(path)
            record("released", identity=identity)  # before the lock goes: ordered before the taker's ready
            os.close(lock_fd)
            lock_fd = None
            time.sleep(float(os.environ.get("STANDIN_HANDED_OVER_DELAY_S", "0")))
            daemon_reports.report(daemon_reports.HANDED_OVER, socket=path, identity=identity)
            record("handed-over", identity=identity)
    record("stop", identity=identity, during="serve")
    if server is not None:
        server.close()
        os.unlink(path)
    if lock_fd is not None:
        os.close(lock_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
