"""End-to-end check of the SGLang plugin with SGLang's real weight-cache daemon and engines, for one GPU.

Prepared for a CUDA host with ``sglang==0.5.23`` (its full install), ``ckptpub`` and
``ckptpub-sglang`` installed (``pip install -e . -e integrations/sglang``); it cannot run on
a CPU (SGLang's daemon needs CUDA IPC) and has NOT been run yet. Tiny models are built
locally, nothing is downloaded; expect 3-6 minutes. One call:

    python examples/gpu_e2e_sglang.py [--workdir /tmp/ckptpub-gpu-e2e-sglang]

Steps (each engine in its own process; greedy tokens from token ids, no tokenizer):

1. A run: ``step-10`` (tiny Qwen3, float32 on disk), ``step-20`` a copy with ``model.norm.weight``
   negated in place (same headers, other values), both published; ``latest -> step-10``.
   Reference tokens: SGLang disk loads (``weight_cache_mode`` off, verified by the plugin).
2. ``python -m ckptpub_sglang.daemon --model-path RUN/latest --gpu-id 0``: SGLang's daemon
   with the plugin, keyed by step 10's identity, its disk load verified.
3. Engines in client mode: ``RUN/latest`` and the alias ``RUN/../run/step-10`` are mapped
   from the daemon (SGLang's "Loaded model via IPC"), with step 10's tokens.
4. ``latest`` moved to ``step-20``: an engine on ``RUN/latest`` is refused by SGLang's own
   comparison ("Daemon config mismatch"), never handed step 10's weights.
5. A copy of step 20 with one byte of ``model.layers.0.mlp.up_proj.weight`` flipped, loaded
   from disk: refused naming that tensor.

Expected output (exit code 0), one line per check, then the summary:

    ok: disk loads of step-10 and step-20 give different tokens
    ok: the daemon serves step-10's identity
    ok: RUN/latest mapped from the daemon, step-10's tokens
    ok: RUN/../run/step-10 mapped from the daemon, step-10's tokens
    ok: RUN/latest after the move refused: Daemon config mismatch
    ok: tampered shard refused: tensor 'model.layers.0.mlp.up_proj.weight' differs from the manifest
    gpu_e2e_sglang: 6 checks passed
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

# gpu_e2e.py sits beside this script (its import puts tests/, the tiny model's builder, on the path)
from gpu_e2e import negate_tensor

ENGINE = dict(dtype="bfloat16", mem_fraction_static=0.15, disable_cuda_graph=True, skip_tokenizer_init=True)
PROMPTS = [[1, 17, 42, 99, 7], [3, 250, 11]]
CHECKS: list[str] = []


def engine_main(job: dict) -> None:
    """Child mode: one SGLang engine, its greedy tokens printed as JSON (or its error, by the traceback)."""
    import sglang

    engine = sglang.Engine(model_path=job["model"], weight_cache_mode=job["mode"], **ENGINE)
    outputs = engine.generate(input_ids=PROMPTS, sampling_params={"temperature": 0, "max_new_tokens": 12})
    print("E2E_RESULT " + json.dumps([o["output_ids"] for o in outputs]), flush=True)
    engine.shutdown()


def run_engine(model: str, mode: str, env: dict) -> tuple[list | None, str]:
    job = json.dumps({"model": model, "mode": mode})
    proc = subprocess.run(
        [sys.executable, __file__, "--engine", job], capture_output=True, text=True, env=env, timeout=600
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("E2E_RESULT ")]
    return (json.loads(lines[-1].split(" ", 1)[1]) if lines else None), proc.stdout + proc.stderr


def check(condition: bool, what: str, log: str = "") -> None:
    if not condition:
        sys.exit(f"gpu_e2e_sglang: FAILED: {what}\n{log[-4000:]}")
    CHECKS.append(what)
    print(f"ok: {what}", flush=True)


def flip_byte(folder: str, name: str) -> None:
    from support.safetensors_files import find_tensor_file, tensor_location

    path = find_tensor_file(folder, name)
    start, _ = tensor_location(path, name)
    with open(path, "r+b") as f:
        f.seek(start + 1)
        byte = f.read(1)
        f.seek(start + 1)
        f.write(bytes([byte[0] ^ 0x01]))


def start_daemon(model: str, output: object, env: dict) -> subprocess.Popen:
    """``python -m ckptpub_sglang.daemon``: SGLang's daemon command, the plugin loaded (own session)."""
    command = [sys.executable, "-m", "ckptpub_sglang.daemon", "--model-path", model, "--gpu-id", "0"]
    command += ["--dtype", ENGINE["dtype"]]
    return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/ckptpub-gpu-e2e-sglang")
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        engine_main(json.loads(args.engine))
        return 0
    import torch

    import ckptpub

    if not torch.cuda.is_available():
        print(
            "gpu_e2e_sglang: error: needs a CUDA GPU (SGLang's weight-cache daemon uses CUDA IPC)",
            file=sys.stderr,
        )
        return 2
    from support.tiny_model import build_tiny_qwen3

    shutil.rmtree(args.workdir, ignore_errors=True)
    run = os.path.join(args.workdir, "run")
    step10, step20 = os.path.join(run, "step-10"), os.path.join(run, "step-20")
    build_tiny_qwen3(step10)  # float32 on disk, served in bfloat16
    shutil.copytree(step10, step20)
    negate_tensor(step20)
    for folder in (step10, step20):
        ckptpub.publish(folder)
    os.symlink("step-10", os.path.join(run, "latest"))
    env = {
        **os.environ,
        "SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE": os.path.join(args.workdir, "wc_{device_uuid}.sock"),
        "SGLANG_WEIGHT_CACHE_READY_TEMPLATE": os.path.join(args.workdir, "wc_{device_uuid}.ready"),
    }

    ref10, log = run_engine(step10, "off", env)
    ref20, log20 = run_engine(step20, "off", env)
    check(
        ref10 is not None and ref20 is not None and ref10 != ref20,
        "disk loads of step-10 and step-20 give different tokens",
        log + log20,
    )

    daemon_log = os.path.join(args.workdir, "daemon.log")
    with open(daemon_log, "w") as output:  # the daemon keeps its own copy of the descriptor
        daemon = start_daemon(os.path.join(run, "latest"), output, env)
    try:
        deadline = time.monotonic() + 300
        while not glob.glob(os.path.join(args.workdir, "wc_*.ready")):
            if daemon.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"gpu_e2e_sglang: the daemon did not come up; see {daemon_log}")
            time.sleep(1)
        identity = ckptpub.read_manifest(step10).identity
        with open(glob.glob(os.path.join(args.workdir, "wc_*.ready"))[0]) as ready_file:
            ready = ready_file.read()
        check(identity in ready, "the daemon serves step-10's identity", ready)

        for model, name in (
            (os.path.join(run, "latest"), "RUN/latest"),
            (os.path.join(run, "..", "run", "step-10"), "RUN/../run/step-10"),
        ):
            tokens, log = run_engine(model, "client", env)
            check(
                tokens == ref10 and "Loaded model via IPC" in log,
                f"{name} mapped from the daemon, step-10's tokens",
                log,
            )

        os.unlink(os.path.join(run, "latest"))
        os.symlink("step-20", os.path.join(run, "latest"))
        tokens, log = run_engine(os.path.join(run, "latest"), "client", env)
        check(
            tokens is None and "Daemon config mismatch" in log,
            "RUN/latest after the move refused: Daemon config mismatch",
            log,
        )
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(60)

    tampered = os.path.join(args.workdir, "tampered")
    shutil.copytree(step20, tampered)
    flip_byte(tampered, "model.layers.0.mlp.up_proj.weight")
    tokens, log = run_engine(tampered, "off", env)
    refusal = "tensor 'model.layers.0.mlp.up_proj.weight' differs from the manifest"
    check(tokens is None and refusal in log, f"tampered shard refused: {refusal}", log)
    print(f"gpu_e2e_sglang: {len(CHECKS)} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
