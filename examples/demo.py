"""The main job, end to end: publish a base, fine-tune it with the callback, inspect the run, verify,
catch tampering, serve through vLLM.

Run with ``make demo`` (which sets up .venv first). Every ckptpub command is a real
subprocess, printed before it runs, so the output reads like a terminal session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# The tensor helpers live with the tests (tests/support): the demo runs from a checkout.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from support.safetensors_files import tensor_location  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "demo-run"
BASE = DEMO / "base"
RUN = DEMO / "run"
BIN = Path(sys.executable).parent


def sh(*args: object, expect: int | tuple[int, ...] = 0, stderr_prefix: str = "") -> str:
    """Run a command as a user would, echo it and its output, and check its exit code.

    With ``stderr_prefix``, only stderr lines starting with it are shown (training and
    vLLM log a lot; the demo shows what ckptpub said). The full stderr is shown on failure.
    """
    words = [str(a) for a in args]
    shown = " ".join(os.path.relpath(w, ROOT) if w.startswith(str(ROOT)) else w for w in words)
    print(f"\n$ {shown}", flush=True)
    command = [str(BIN / words[0])] + words[1:] if (BIN / words[0]).exists() else words
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    sys.stdout.write(result.stdout)
    expected = (expect,) if isinstance(expect, int) else expect
    if result.returncode not in expected:
        sys.stdout.write(result.stderr)
        sys.exit(f"demo: '{shown}' exited {result.returncode}, expected {expected}")
    sys.stdout.writelines(
        line for line in result.stderr.splitlines(keepends=True) if line.startswith(stderr_prefix)
    )
    return result.stdout


def flip_tensor_byte(folder: Path, name: str) -> None:
    """Flip one byte deep inside tensor ``name``: same size, same header, different weights."""
    shard = folder / "model.safetensors"
    begin, end = tensor_location(str(shard), name)
    offset = begin + (end - begin) // 2
    with open(shard, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ 0x01]))
    print(f"(flipped one bit of {name} at byte {offset} of {shard.name})")


def main() -> None:
    shutil.rmtree(DEMO, ignore_errors=True)
    print(
        "== 1. A base model (a tiny Qwen3 made offline, bfloat16: stands in for a download), published first"
    )
    sh(sys.executable, ROOT / "examples" / "fine_tune.py", "--init-base", BASE, stderr_prefix="ckptpub:")
    sh("ckptpub", "publish", BASE)

    print("\n== 2. Fine-tune it; PublishCallback writes ckptpub.json at every save, naming the base")
    sh(
        sys.executable,
        ROOT / "examples" / "fine_tune.py",
        BASE,
        RUN,
        "--steps",
        "40",
        "--save-steps",
        "10",
        stderr_prefix="ckptpub:",
    )

    print("\n== 3. The run at a glance: its steps from the run index, and its lineage")
    sh("ckptpub", "ls", RUN)
    sh("ckptpub", "log", RUN)
    print("\n== 4. What changed: base -> first checkpoint (a dtype cast and two config keys), then training")
    sh("ckptpub", "diff", BASE, RUN / "checkpoint-10", expect=1)
    sh("ckptpub", "diff", RUN / "checkpoint-10", RUN / "checkpoint-40", expect=1)
    sh("ckptpub", "show", RUN / "checkpoint-40")

    print("\n== 5. Verify every byte of the last step")
    sh("ckptpub", "verify", RUN / "checkpoint-40")

    print("\n== 6. Tamper with one tensor of a copy: verify names it (exit 1)")
    tampered = DEMO / "tampered"
    shutil.copytree(RUN / "checkpoint-40", tampered)
    flip_tensor_byte(tampered, "model.norm.weight")
    sh("ckptpub", "verify", "--quiet", tampered, expect=1)

    print("\n== 7. Serve the trained checkpoint through vLLM (CPU build) with --load-format manifest_cache")
    sh(
        sys.executable,
        ROOT / "examples" / "serve_demo.py",
        RUN / "checkpoint-40",
        stderr_prefix="serve_demo:",
    )
    print("\n== 8. The tampered copy, served with the original's manifest, is refused")
    sh(sys.executable, ROOT / "examples" / "serve_demo.py", tampered, expect=1, stderr_prefix="serve_demo:")
    print("\ndemo: all steps behaved as expected")


if __name__ == "__main__":
    main()
