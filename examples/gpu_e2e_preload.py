"""End-to-end check of ``ckptpub preload`` with real weight-cache daemons, for one GPU.

Prepared for a CUDA host with ``vllm`` (0.32.x or 0.33.x), ``ckptpub`` and
``ckptpub-vllm`` installed (the ``ckptpub preload`` command comes from the latter);
it cannot run on the CPU build (the daemon needs CUDA IPC) and has NOT been run yet.
Tiny models are built locally, nothing is downloaded; expect 5-10 minutes. Run it as
one script when a GPU machine is lent:

    python examples/gpu_e2e_preload.py [--workdir /tmp/ckptpub-e2e-pl]

Every engine is started with **no socket option**: it must find the supervisor's
daemon on vLLM's default socket path, as an operator's ``vllm serve DIR --load-format
manifest_cache`` does. Steps (engines run in their own processes; exit code 0 only if
every check holds):

1. A training run folder: step 10 (tiny Qwen3), published, recorded in
   ``ckptpub-index.jsonl``. Step 20 (prepared now, recorded later) is a copy with
   ``model.norm.weight`` negated in place: same headers, different values.
   Reference tokens: plain ``auto`` loads of both (greedy).
2. ``ckptpub preload --follow RUN`` (overlap mode, real ``vllm preload``): the status
   becomes ``ready`` holding step 10's identity, reported by the daemon process.
3. Engine: ``manifest_cache`` on step 10, ``fallback: false``: mapped from the daemon
   (vLLM's ``Mapped`` line), step 10's tokens. A second engine on step 10 is started and
   kept running (``zero_copy``, vLLM's default mode: it computes with the daemon's GPU
   memory).
4. Record step 20: the supervisor re-preloads (``why: weights-changed``); the new daemon
   takes the default socket path over, and the old daemon, which the running engine
   maps, is kept (``--status``: ``retired`` with that engine's pid). The running engine
   generates again: still step 10's tokens, so the memory it maps is still the old
   daemon's, alive. Then that engine exits, and the supervisor stops the old daemon
   (``stopped-old``). This is the GPU check of docs/preload.md, "Engines still mapped
   to the old daemon": on CPU the shim ships tensors by value and cannot show it.
5. A new engine on step 20: mapped from the new daemon, tokens equal to the disk load of
   step 20. An engine pinned to step 10 with ``fallback: false`` is refused in one line
   naming both identities.
6. Record step 30 as a copy of step 20 and re-publish step 20: no re-preload
   (``same-identity-*``), the same daemon pid keeps serving.
7. ``SIGKILL`` the supervisor, start it again: it adopts the running daemon (same
   pid, no reload). ``SIGTERM``: it stops the daemon and exits 0.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

# gpu_e2e.py sits beside this script: Python imports from a script's own folder
import gpu_e2e
from gpu_e2e import ENGINE, cuda_available, negate_tensor, run_engine, script_args

DAEMON_ARGS = [
    "--dtype",
    ENGINE["dtype"],
    "--max-model-len",
    str(ENGINE["max_model_len"]),
    "--enforce-eager",
    "--gpu-memory-utilization",
    "0.15",
]


def append_index(run_dir: str, step: int, rel: str, identity: str) -> None:
    """One line of ``ckptpub-index.jsonl``, written as the Trainer callback writes it."""
    from ckptpub._filesystem import run_index  # imported where ckptpub is (main): not in the engine children

    run_index.append(run_dir, step=step, path=rel, identity=identity, time=time.time())


def status(state_dir: str) -> dict:
    proc = subprocess.run(
        ["ckptpub", "preload", "--status", "--json", "--state-dir", state_dir], capture_output=True, text=True
    )
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return {}


def wait_ready(state_dir: str, identity: str, sup: subprocess.Popen, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = status(state_dir)
        held = s.get("held") or {}
        if s.get("state") == "ready" and held.get("identity") == identity and not s.get("loading"):
            return s
        if sup.poll() is not None:
            raise SystemExit(f"gpu_e2e_preload: the supervisor exited ({sup.returncode}); see {state_dir}")
        time.sleep(2)
    raise SystemExit(
        f"gpu_e2e_preload: no daemon holding {identity} after {timeout:.0f}s; see {state_dir}/logs"
    )


def start_supervisor(run_dir: str, state_dir: str, log_path: str) -> subprocess.Popen:
    with open(log_path, "a") as log:  # the supervisor keeps its own copy of the descriptor
        return subprocess.Popen(
            [
                "ckptpub",
                "preload",
                "--follow",
                run_dir,
                "--state-dir",
                state_dir,
                "--interval",
                "1",
                "--",
                *DAEMON_ARGS,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class HeldEngine:
    """An engine process that stays up, mapped to a daemon, and generates again when asked."""

    def __init__(self, model: str) -> None:
        job = json.dumps(
            {"model": model, "load_format": "manifest_cache", "extra": {"fallback": False}, "hold": True}
        )
        self.proc = subprocess.Popen(
            [sys.executable, gpu_e2e.__file__, "--engine", job],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.log: list[str] = []

    def tokens(self) -> list | None:
        """The next result it prints (None when it exits first)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)
            if line.startswith("E2E_RESULT "):
                return json.loads(line.split(" ", 1)[1])
        return None

    def again(self) -> list | None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("again\n")
        self.proc.stdin.flush()
        return self.tokens()

    def exit(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def wait_until(what, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(1)
    return None


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def main() -> int:
    args = script_args("/tmp/ckptpub-e2e-pl")
    if args is None:
        return 0
    if not cuda_available("gpu_e2e_preload"):
        return 2

    from ckptpub_vllm.preload.status import read_decisions
    from ckptpub_vllm.shared import daemon_reports
    from support.tiny_model import build_tiny_qwen3  # gpu_e2e put tests/ on the path

    import ckptpub

    shutil.rmtree(args.workdir, ignore_errors=True)
    run_dir, state_dir = os.path.join(args.workdir, "run"), os.path.join(args.workdir, "st")
    s10, s20, s30 = (os.path.join(run_dir, f"checkpoint-{n}") for n in (10, 20, 30))
    build_tiny_qwen3(s10, max_shard_size="150KB")
    id10 = ckptpub.publish(s10).identity
    shutil.copytree(s10, s20)
    os.remove(os.path.join(s20, ckptpub.MANIFEST_NAME))
    negate_tensor(s20)
    id20 = ckptpub.publish(s20).identity  # published now for the references; recorded in the index later
    checks: list[tuple[str, bool]] = [("steps 10 and 20 have different identities", id10 != id20)]

    ref10, _ = run_engine(s10, "auto")
    ref20, _ = run_engine(s20, "auto")
    checks.append(
        ("steps 10 and 20 generate different tokens from disk", ref10 is not None and ref10 != ref20)
    )

    append_index(run_dir, 10, "checkpoint-10", id10)
    sup_log = os.path.join(args.workdir, "supervisor.log")
    sup = start_supervisor(run_dir, state_dir, sup_log)
    second = None
    held: HeldEngine | None = None
    try:
        st10 = wait_ready(state_dir, id10, sup)
        pid10 = st10["held"]["pid"]
        with open(st10["held"]["log"]) as handle:
            reports = [r for r in map(daemon_reports.parse, handle.read().splitlines()) if r]
        checks.append(
            (
                "the daemon process reported step 10's manifest identity (keyed, verified, serving)",
                {r["event"] for r in reports} >= {"keyed", "verified", "serving"}
                and {r.get("identity") for r in reports if "identity" in r} == {id10},
            )
        )
        t10, log10 = run_engine(s10, "manifest_cache", {"fallback": False})  # no socket option
        checks.append(("step 10 is mapped from the daemon", "from the weight cache daemon" in log10))
        checks.append(("step 10's tokens", t10 == ref10))
        held = HeldEngine(s10)
        checks.append(("a kept-running engine maps step 10", held.tokens() == ref10))

        append_index(run_dir, 20, "checkpoint-20", id20)  # "publish" step 20
        st20 = wait_ready(state_dir, id20, sup)
        why = [
            e["why"]
            for e in read_decisions(state_dir)
            if e.get("event") == "decision" and e.get("action") == "replace"
        ]
        checks.append(("re-preloaded for step 20 because its weights changed", why == ["weights-changed"]))
        retired = st20.get("retired") or []
        checks.append(
            (
                "the old daemon is kept for the engine that maps it",
                alive(pid10) and [(d["pid"], d["engines"]) for d in retired] == [(pid10, [held.proc.pid])],
            )
        )
        checks.append(("the kept-running engine still generates step 10's tokens", held.again() == ref10))
        held.exit()
        stopped = wait_until(lambda: not alive(pid10) and status(state_dir).get("retired") == [])
        checks.append(("the old daemon is stopped once that engine exited", bool(stopped)))
        t20, log20 = run_engine(s20, "manifest_cache", {"fallback": False})
        checks.append(
            ("a new engine maps step 20 from the new daemon", "from the weight cache daemon" in log20)
        )
        checks.append(("step 20's tokens equal a disk load of step 20", t20 == ref20))
        pinned, log_pinned = run_engine(s10, "manifest_cache", {"fallback": False, "expect_identity": id10})
        checks.append(
            (
                "an engine asking for step 10 is refused naming both identities",
                pinned is None
                and f"the daemon holds checkpoint {id20}" in log_pinned
                and f"this engine asked for {id10}" in log_pinned,
            )
        )

        pid20 = st20["held"]["pid"]
        shutil.copytree(s20, s30)
        append_index(run_dir, 30, "checkpoint-30", ckptpub.read_manifest(s30).identity)
        ckptpub.publish(s30)  # re-publish: same identity
        time.sleep(5)
        s = status(state_dir)
        whys = [e["why"] for e in read_decisions(state_dir) if e.get("event") == "decision"][-2:]
        checks.append(
            (
                "a copy at a new path and a re-publish do not re-preload",
                s["held"]["pid"] == pid20 and all(w.startswith("same-identity") for w in whys),
            )
        )

        sup.kill()
        sup.wait()
        second = start_supervisor(run_dir, state_dir, sup_log)
        time.sleep(5)
        s = wait_ready(state_dir, id20, second)
        adopted = [e for e in read_decisions(state_dir) if e.get("why") == "adopted"]
        checks.append(
            ("a restarted supervisor adopts the running daemon", s["held"]["pid"] == pid20 and adopted)
        )
        second.send_signal(signal.SIGTERM)
        code = second.wait(timeout=120)
        checks.append(("SIGTERM stops the supervisor and its daemon", code == 0 and not alive(pid20)))
    finally:
        if held is not None and held.proc.poll() is None:
            held.exit()
        for proc in (sup, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=120)

    for what, ok in checks:
        print(f"{'OK  ' if ok else 'FAIL'} {what}")
    print(f"step 10 {id10}\nstep 20 {id20}\nstate  {state_dir}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
