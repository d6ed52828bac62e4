"""Helpers for the ``ckptpub preload`` tests: tiny checkpoints, a supervisor process, waiting.

The supervisor runs as a real process (``python -m ckptpub preload ...``, i.e. through
the ``ckptpub.commands`` entry point) with the daemon command substituted by
``tests/preload/standin_daemon.py``; everything the tests check is read from the files processes
write (the decision log, ``status.json``, the stand-in's record).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

import ckptpub
from ckptpub._filesystem import jsonfiles, run_index
from support.checkpoints import CONFIG, model_tensors, write_checkpoint

#: The stand-in for vLLM's weight-cache daemon (a script of the preload tests).
STANDIN = Path(__file__).parents[1] / "preload" / "standin_daemon.py"
STANDIN_CMD = f"{shlex.quote(sys.executable)} {shlex.quote(str(STANDIN))} --model {{folder}}"


def make_checkpoint(
    folder: Path, seed: int = 0, config: dict | None = None, provenance: dict | None = None
) -> str:
    """A tiny checkpoint (real safetensors, numpy), published with ``ckptpub.publish``; its identity."""
    write_checkpoint(folder, model_tensors(seed=seed, layers=1), config=config or CONFIG, extra_files=False)
    return ckptpub.publish(folder, provenance=provenance).identity


def make_adapter(folder: Path, base: Path | None, base_identity: str | None, seed: int = 0) -> str:
    """A PEFT LoRA adapter folder as ``save_pretrained`` writes it (config naming its base folder, the
    adapter's tensors), published with its base identity recorded as the Trainer callback records it."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "base_model_name_or_path": str(base) if base is not None else "org/hub-model",
        "peft_type": "LORA",
        "r": 4,
        "lora_alpha": 8,
        "target_modules": ["q_proj"],
        "task_type": "CAUSAL_LM",
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    rng = np.random.default_rng(seed)
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    tensors = {
        f"{prefix}.lora_A.weight": rng.standard_normal((4, 16), dtype=np.float32),
        f"{prefix}.lora_B.weight": rng.standard_normal((16, 4), dtype=np.float32),
    }
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    provenance = {"base_identity": base_identity} if base_identity else None
    return ckptpub.publish(folder, provenance=provenance).identity


class Run:
    """A training-run folder with a run index, written the way the Trainer callback writes it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def append(self, step: int, rel: str, identity: str) -> None:
        run_index.append(self.root, step=step, path=rel, identity=identity, time=time.time())


class SupervisorProc:
    """``ckptpub preload`` as a subprocess, with a state dir and a stand-in record file."""

    def __init__(
        self,
        tmp: Path,
        target_args: list[str],
        *,
        extra_opts: list[str] | None = None,
        env: dict[str, str] | None = None,
        state_dir: Path | None = None,
        record: Path | None = None,
        passthrough: list[str] | None = None,
        daemon_cmd: str | None = STANDIN_CMD,
    ) -> None:
        """``daemon_cmd=None``: ckptpub preload's default daemon command (vLLM's real ``vllm preload``).

        ``TMPDIR`` is a fresh short folder of its own unless ``env`` names one: vLLM's
        default socket folder is under it, so supervisors of parallel tests (and of
        other people's runs on this machine) never meet on one socket path.
        """
        self.state_dir = state_dir or tmp / "state"
        self.record = record or tmp / "standin-record.jsonl"
        self.stderr_path = tmp / f"supervisor-{time.monotonic_ns()}.err"
        standin = {"STANDIN_RECORD": str(self.record), "STANDIN_LOAD_S": "0.2"} if daemon_cmd else {}
        self.tmpdir = None if env and "TMPDIR" in env else tempfile.mkdtemp(prefix="ckpl", dir="/tmp")
        private = {"TMPDIR": self.tmpdir} if self.tmpdir else {}
        self.env = {**os.environ, **standin, **private, **(env or {})}
        self.argv = [
            sys.executable,
            "-m",
            "ckptpub",
            "preload",
            *target_args,
            "--state-dir",
            str(self.state_dir),
            *(["--daemon-cmd", daemon_cmd] if daemon_cmd else []),
            "--interval",
            "0.1",
            "--stop-timeout",
            "10",
            "--ready-timeout",
            "30",
            "--retry-delay",
            "1",
            *(extra_opts or []),
        ]
        if passthrough:
            self.argv += ["--", *passthrough]
        self.proc: subprocess.Popen | None = None

    def start(self) -> SupervisorProc:
        with open(self.stderr_path, "ab") as stderr:  # the supervisor keeps its own copy
            self.proc = subprocess.Popen(
                self.argv, stdout=subprocess.DEVNULL, stderr=stderr, env=self.env, start_new_session=True
            )
        return self

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def terminate(self, timeout: float = 30) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # SIGKILL the supervisor only (not its daemon's process group)
        self.proc.wait(timeout=10)

    def cleanup(self) -> None:
        """Stop anything left running (the supervisor, then any daemon it recorded or the stand-in did)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        from ckptpub_vllm.preload.daemon_process import proc_cmdline
        from ckptpub_vllm.preload.status import read_json

        recorded = [read_json(str(self.state_dir / name)) for name in ("daemon.json", "loading.json")]
        recorded += read_json(str(self.state_dir / "retired.json")) or []
        pids = [rec["pid"] for rec in records(self.record) if rec["event"] == "start"]
        pids += [
            rec["pid"]
            for rec in recorded  # only a live process still running the recorded command
            if isinstance(rec, dict) and rec.get("pid") and proc_cmdline(rec["pid"]) == rec.get("argv")
        ]
        for pid in pids:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)  # the daemon's whole group
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    # -- reading what it wrote -------------------------------------------

    def decisions(self) -> list[dict]:
        from ckptpub_vllm.preload.status import read_decisions

        return read_decisions(str(self.state_dir))

    def status(self) -> dict:
        from ckptpub_vllm.preload.status import read_json

        status = read_json(str(self.state_dir / "status.json"))
        return (
            status if isinstance(status, dict) else {}
        )  # a planted one, until the supervisor writes its own

    def standin(self) -> list[dict]:
        return records(self.record)


def records(path: Path) -> list[dict]:
    """The stand-in daemon's records (``jsonfiles`` lines), oldest first."""
    return [entry for _, entry in jsonfiles.read_lines(str(path), 64 << 20, path.name)]


def wait_for(predicate, timeout: float = 30, what: str = "condition", proc: SupervisorProc | None = None):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.proc is not None and proc.proc.poll() is not None:
            raise AssertionError(
                f"supervisor exited ({proc.proc.returncode}) while waiting for {what}:\n"
                f"{proc.stderr()[-3000:]}"
            )
        if time.monotonic() > deadline:
            tail = proc.stderr()[-3000:] if proc is not None else ""
            raise AssertionError(f"timed out waiting for {what}\n{tail}")
        time.sleep(0.05)


def ready_with(sup: SupervisorProc, identity: str):
    """Status says ready, holding ``identity`` (and no load in progress)."""

    def check():
        s = sup.status()
        held = s.get("held") or {}
        return (
            s
            if (s.get("state") == "ready" and held.get("identity") == identity and not s.get("loading"))
            else None
        )

    return check


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
