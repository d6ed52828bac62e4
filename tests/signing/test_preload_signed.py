"""``ckptpub preload`` with a trusted key: a daemon never preloads what the key did not sign.

Real processes: the supervisor (``python -m ckptpub preload --follow RUN``) and the
stand-in daemon of ``tests/preload`` (vLLM's daemon needs CUDA IPC), which computes its
weight-cache key in its own process with the plugin's ``checkpoint_key``, as a real
``vllm preload`` daemon does. ``--public-key`` reaches the daemons through ``CKPTPUB_PUBLIC_KEY``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.checkpoints import CONFIG, model_tensors, write_checkpoint  # noqa: E402
from support.preload_helpers import STANDIN, Run, SupervisorProc, ready_with, wait_for  # noqa: E402

import ckptpub  # noqa: E402


def _checkpoint(folder: Path, seed: int, sign: Path | None, sign_hash: str = "sha256") -> str:
    write_checkpoint(folder, model_tensors(seed=seed, layers=1), config=CONFIG, extra_files=False)
    return ckptpub.publish(folder, sign=sign, sign_hash=sign_hash).identity


def test_follow_preloads_only_signed_steps(tmp_path: Path, keys: dict) -> None:
    """Step 5 signed with SHA-256 file digests, step 20 with BLAKE3: both are the key's."""
    run = Run(tmp_path / "run")
    signed_5 = _checkpoint(run.root / "checkpoint-5", 5, keys["trainer"].private)
    run.append(5, "checkpoint-5", signed_5)
    unsigned_10 = _checkpoint(run.root / "checkpoint-10", 10, None)
    run.append(10, "checkpoint-10", unsigned_10)
    stranger_15 = _checkpoint(run.root / "checkpoint-15", 15, keys["stranger"].private)
    run.append(15, "checkpoint-15", stranger_15)
    sup = SupervisorProc(
        tmp_path, ["--follow", str(run.root)], extra_opts=["--public-key", str(keys["trainer"].public)]
    ).start()
    try:
        wait_for(ready_with(sup, signed_5), 60, "the signed step 5 held", sup)
        signed_20 = _checkpoint(run.root / "checkpoint-20", 20, keys["trainer"].private, "blake3")
        run.append(20, "checkpoint-20", signed_20)
        wait_for(ready_with(sup, signed_20), 60, "the signed step 20 held", sup)
        started = [r["identity"] for r in sup.standin() if r["event"] == "start"]
        assert started == [signed_5, signed_20]
        notes = " ".join(str(e) for e in sup.decisions())
        for expected in ("skipped step 10", "no model.sig", "skipped step 15", "signature does not verify"):
            assert expected in notes
    finally:
        sup.cleanup()


@pytest.mark.parametrize("signer", ["none", "stranger"])
def test_a_daemon_refuses_an_unsigned_checkpoint_itself(tmp_path: Path, keys: dict, signer: str) -> None:
    """The daemon process checks the key too, whoever started it (not only the supervisor)."""
    folder = tmp_path / "checkpoint"
    _checkpoint(folder, 1, None if signer == "none" else keys["stranger"].private)
    result = subprocess.run(
        [sys.executable, str(STANDIN), "--model", str(folder)],
        env={**os.environ, "CKPTPUB_PUBLIC_KEY": str(keys["trainer"].public)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert "ckptpub: refusing to serve" in result.stdout
    assert "a signed checkpoint is required" in result.stdout


def test_an_unsigned_model_dir_is_refused_at_start(tmp_path: Path, keys: dict) -> None:
    folder = tmp_path / "checkpoint"
    _checkpoint(folder, 1, None)
    result = subprocess.run(
        [sys.executable, "-m", "ckptpub", "preload", str(folder), "--public-key", str(keys["trainer"].public),
         "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    why = f"{folder}: no model.sig, so it is not signed; publish it with --sign KEY (sign=...)"
    assert result.stderr.strip().splitlines() == [f"ckptpub preload: error: {why}"]
