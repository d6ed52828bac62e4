"""A listed file swapped while another is being hashed: never followed out of the folder, never read.

Generated: every kind of swap x {publish, verify}, through the Python API in a
subprocess with a timeout (a hang fails). The swap happens from the progress
callback, after hashing has begun and before ``tokenizer.json`` is opened, so the
race is hit every time. The outside file holds the very bytes of
``tokenizer.json``: a reader that followed the link would hash matching bytes and
not notice. The outcome must be a one-line ``CkptpubError`` naming
``tokenizer.json`` (publish writes no manifest), and no path outside the folder opened.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.checkpoints import write_checkpoint

SWAPS = {
    "symlink out of the folder": "is a symlink",
    "symlink to another file inside": "is a symlink",
    "FIFO": "not a regular file",
    "socket": "not a regular file",
    "another file with the same bytes": "replaced by another file",
}

SCRIPT = r"""
import json, os, stat, sys
import ckptpub
# imported before the audit hook: only the run's own opens are logged
import ckptpub._operations.publishing, ckptpub._operations.verify

folder, outside, entry, swap, log = sys.argv[1:6]
opened = []

def where(path, nofollow):
    # resolved when opened (the folder changes later): with O_NOFOLLOW the last component is not followed
    path = os.path.abspath(os.fsdecode(path))
    if nofollow:
        return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    return os.path.realpath(path)

def audit(event, args):
    if event == "open" and isinstance(args[0], (str, bytes)) and isinstance(args[2], int):
        opened.append(where(args[0], bool(args[2] & os.O_NOFOLLOW)))

sys.addaudithook(audit)
target = os.path.join(folder, "tokenizer.json")
done = []

def swap_once(done_bytes, total):
    if done:
        return
    done.append(True)
    data = open(target, "rb").read()
    os.rename(target, outside + ".kept")  # kept alive, so the new file cannot reuse its inode number
    if swap == "symlink out of the folder":
        os.symlink(outside, target)
    elif swap == "symlink to another file inside":
        os.symlink("logs/train.txt", target)
    elif swap in ("FIFO", "socket"):
        os.mknod(target, 0o644 | (stat.S_IFIFO if swap == "FIFO" else stat.S_IFSOCK))
    else:
        with open(target + ".new", "wb") as handle:
            handle.write(data)
        os.replace(target + ".new", target)

try:
    if entry == "publish":
        ckptpub.publish(folder, threads=1, on_progress=swap_once)
    else:
        ckptpub.verify(folder, threads=1, on_progress=swap_once)
    code = 0
except ckptpub.CkptpubError as error:
    print(f"ckptpub: error: {error}", file=sys.stderr)
    code = 2
record = list(opened)  # before the log itself is opened
json.dump(record, open(log, "w"))
sys.exit(code if done else 3)
"""


@pytest.mark.parametrize("entry", ["publish", "verify"])
@pytest.mark.parametrize("swap", SWAPS)
def test_swap_while_hashing(tmp_path: Path, swap: str, entry: str) -> None:
    folder = write_checkpoint(tmp_path / "box" / "ckpt")
    if entry == "verify":
        assert (
            subprocess.run([sys.executable, "-m", "ckptpub", "publish", str(folder)], timeout=60).returncode
            == 0
        )
    outside = tmp_path / "outside.json"
    shutil.copy(folder / "tokenizer.json", outside)
    log = tmp_path / "opened.json"
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(folder), str(outside), entry, swap, str(log)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stderr.startswith("ckptpub: error: tokenizer.json: "), result.stderr
    assert SWAPS[swap] in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    if entry == "publish":
        assert not (folder / "ckptpub.json").exists()
    root = os.path.realpath(folder)
    for real in json.loads(log.read_text()):
        assert real.startswith((root + os.sep, sys.prefix, sys.base_prefix)), (
            f"opened outside the folder: {real}"
        )
