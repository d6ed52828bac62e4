"""``examples/serve_demo.py`` (used by ``make demo``) end to end on the CPU build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # vLLM engines (examples/serve_demo.py)

DEMO = Path(__file__).resolve().parents[2] / "examples" / "serve_demo.py"


def demo(folder):
    return subprocess.run(
        [sys.executable, str(DEMO), folder, "--max-tokens", "8"], capture_output=True, text=True, timeout=600
    )


def test_serve_demo_prints_both_answers(models):
    proc = demo(models["v1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(ln.startswith("manifest_cache ") for ln in lines)
    assert any(ln.startswith("auto ") for ln in lines)
    assert "same tokens:  yes" in lines
