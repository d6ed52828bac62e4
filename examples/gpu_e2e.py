"""End-to-end check of ``manifest_cache`` with a real weight-cache daemon, for one GPU.

Prepared for a CUDA host with ``vllm`` (0.32.x or 0.33.x), ``ckptpub`` and
``ckptpub-vllm`` installed; it cannot run on the CPU build (no CUDA IPC). Tiny
models are built locally, nothing is downloaded; expect 4-8 minutes on one GPU.

    python examples/gpu_e2e.py [--workdir /tmp/ckptpub-gpu-e2e]

Steps (each engine runs in its own process; exit code 0 only if every check holds):

1. Build v1 (tiny Qwen3) and v2 (a copy with ``model.norm.weight`` scaled in place:
   same shard layout, same headers, different values); publish both.
2. Reference tokens: plain ``auto`` loads of v1 and v2 (greedy).
3. ``vllm preload --model v1`` (with the plugin): the daemon is keyed by v1's
   manifest identity and loads v1 verified.
4. ``manifest_cache`` on v1 with ``fallback: false``: mapped from the daemon (log
   "Mapped ... tensors from the weight cache daemon"), v1's reference tokens.
5. ``manifest_cache`` on v2: the daemon answers a mismatch on ``checkpoint``, the
   engine loads v2 from disk, verified, and produces v2's reference tokens.
6. The bug this project fixes, with the plugin switched off (``VLLM_PLUGINS=none``)
   for a second daemon and engine: a stock daemon on v1, stock ``ipc_cache`` asked
   for v2, serves v1's tokens for v2 and logs success.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

# The tiny model's one builder and the tensor helpers live with the tests: run from a checkout.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

ENGINE = dict(
    dtype="bfloat16", max_model_len=128, enforce_eager=True, max_num_seqs=2, gpu_memory_utilization=0.15
)
PROMPTS = ["the quick brown fox", "a checkpoint is"]
NO_PLUGIN = {"VLLM_PLUGINS": "none"}  # an allow-list that matches no plugin


def engine_main(job: dict) -> None:
    """Child mode: start one engine, print its greedy tokens as JSON.

    With ``"hold": true`` the engine stays up and generates again, printing its
    tokens again, for each line read from stdin, until stdin ends.
    """
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=job["model"],
        load_format=job["load_format"],
        model_loader_extra_config=job.get("extra") or {},
        **ENGINE,
    )
    while True:
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
        print("E2E_RESULT " + json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)
        if not job.get("hold") or not sys.stdin.readline():
            return


def run_engine(model: str, load_format: str, extra: dict | None = None, env: dict | None = None):
    job = json.dumps({"model": model, "load_format": load_format, "extra": extra or {}})
    proc = subprocess.run(
        [sys.executable, __file__, "--engine", job],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )
    log = proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("E2E_RESULT ")]
    tokens = json.loads(lines[-1].split(" ", 1)[1]) if lines else None
    return tokens, log


def start_daemon(model: str, socket_dir: str, env: dict | None = None) -> subprocess.Popen:
    os.makedirs(socket_dir, mode=0o700, exist_ok=True)
    cmd = [
        "vllm",
        "preload",
        "--model",
        model,
        "--weight-cache-socket-dir",
        socket_dir,
        "--dtype",
        ENGINE["dtype"],
        "--max-model-len",
        str(ENGINE["max_model_len"]),
        "--enforce-eager",
    ]
    log = os.path.join(socket_dir, "preload.log")
    with open(log, "w") as output:  # the daemon keeps its own copy of the descriptor
        proc = subprocess.Popen(
            cmd,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    deadline = time.monotonic() + 300
    while not glob.glob(os.path.join(socket_dir, "*.sock")):  # bound only after loading
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"gpu_e2e: vllm preload did not come up; see {log}")
        time.sleep(1)
    return proc


def stop_daemon(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def script_args(default_workdir: str) -> argparse.Namespace | None:
    """Arguments of a GPU script (``--workdir``); None once this process ran as an engine child."""
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=default_workdir)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        engine_main(json.loads(args.engine))
        return None
    return args


def cuda_available(program: str) -> bool:
    import torch

    if not torch.cuda.is_available():
        print(f"{program}: error: needs a CUDA GPU (the weight-cache daemon uses CUDA IPC)", file=sys.stderr)
    return torch.cuda.is_available()


def negate_tensor(folder: str, name: str = "model.norm.weight") -> None:
    """Same header, same size, different values: the case header-only keys cannot tell apart."""
    import torch
    from support.safetensors_files import find_tensor_file, tensor_location

    path = find_tensor_file(folder, name)
    start, end = tensor_location(path, name)
    with open(path, "r+b") as f:
        f.seek(start)
        values = torch.frombuffer(bytearray(f.read(end - start)), dtype=torch.float32) * -1.0
        f.seek(start)
        f.write(values.numpy().tobytes())


def main() -> int:
    args = script_args("/tmp/ckptpub-gpu-e2e")
    if args is None:
        return 0
    if not cuda_available("gpu_e2e"):
        return 2

    from support.tiny_model import build_tiny_qwen3

    import ckptpub

    shutil.rmtree(args.workdir, ignore_errors=True)
    v1, v2 = os.path.join(args.workdir, "v1"), os.path.join(args.workdir, "v2")
    build_tiny_qwen3(v1, max_shard_size="150KB")
    ckptpub.publish(v1)
    shutil.copytree(v1, v2)
    negate_tensor(v2)
    ckptpub.publish(v2)
    id1, id2 = ckptpub.read_manifest(v1).identity, ckptpub.read_manifest(v2).identity
    checks: list[tuple[str, bool]] = [("v1 and v2 have different identities", id1 != id2)]

    ref1, _ = run_engine(v1, "auto")
    ref2, _ = run_engine(v2, "auto")
    checks.append(("v1 and v2 generate different tokens from disk", ref1 is not None and ref1 != ref2))

    ours_dir, stock_dir = os.path.join(args.workdir, "sock-ours"), os.path.join(args.workdir, "sock-stock")
    daemon = start_daemon(v1, ours_dir)
    try:
        t1, log1 = run_engine(v1, "manifest_cache", {"socket_dir": ours_dir, "fallback": False})
        checks.append(
            (
                "v1 via manifest_cache is mapped from the daemon",
                "Mapped" in log1 and "from the weight cache daemon" in log1,
            )
        )
        checks.append(("v1 via manifest_cache has v1's tokens", t1 == ref1))
        t2, log2 = run_engine(v2, "manifest_cache", {"socket_dir": ours_dir})
        checks.append(("v2 is refused by the daemon (mismatch on checkpoint)", "['checkpoint']" in log2))
        checks.append(("v2 is loaded from disk and verified", "loaded and verified" in log2))
        checks.append(("v2 via manifest_cache has v2's tokens", t2 == ref2))
    finally:
        stop_daemon(daemon)

    stock = start_daemon(v1, stock_dir, env=NO_PLUGIN)
    try:
        t3, log3 = run_engine(v2, "ipc_cache", {"socket_dir": stock_dir}, env=NO_PLUGIN)
        checks.append(
            (
                "BUG (stock vLLM): ipc_cache asked for v2 maps v1's weights and serves v1's tokens",
                t3 == ref1 and t3 != ref2 and "Mapped" in log3,
            )
        )
    finally:
        stop_daemon(stock)

    for what, ok in checks:
        print(f"{'OK  ' if ok else 'FAIL'} {what}")
    print(f"v1 {id1}\nv2 {id2}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
