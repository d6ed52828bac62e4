"""The refusal relay file (``CKPTPUB_REFUSAL_FILE``): never written, emptied or read through what is planted.

The process that starts an engine makes a new relay file for each start, in a private folder
of its own, and forgets it once the engine started; engine processes append to it. Each case
runs both ends (``ckptpub_vllm.shared.refusals``, as the front end and a worker call them) in a
real process under a timeout, with the variable or the name planted as a hostile or careless
user would: a symlink at a name the variable still holds after an earlier engine (the issue's
case), the variable set to a symlink, a FIFO, a folder, another user's regular file holding a
forged refusal. No vLLM engine is started: the relay is the plugin's, not vLLM's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

OUTSIDE_TEXT = "outside: never written\n"

#: Runs in a fresh interpreter: ``sys.argv[1]`` names what to do; prints a JSON report.
SCRIPT = r"""
import json, os, sys
from ckptpub.serving import RefusedError
from ckptpub_vllm.shared import refusals

VAR = "CKPTPUB_REFUSAL_FILE"
what = sys.argv[1]
report = {}
if what == "worker":  # an engine process relaying to whatever the variable names
    refusals.relay(RefusedError("/models/m", "tensor x differs"))
elif what == "starts":  # the front end: two engine starts, a symlink planted at the first one's name
    refusals.start_relay()
    first = os.environ[VAR]
    report["first"] = first
    report["first_mode"] = oct(os.stat(os.path.dirname(first)).st_mode & 0o777)
    refusals.relay(RefusedError("/models/m", "first"))
    report["first_read"] = str(refusals.relayed_refusal())
    refusals.end_relay()
    report["after_end"] = os.environ.get(VAR)
    report["first_gone"] = not os.path.lexists(os.path.dirname(first))
    os.makedirs(os.path.dirname(first))  # another user re-creates the name in the shared folder
    os.symlink(sys.argv[2], first)
    os.environ[VAR] = first  # a stale name, as an engine process that outlived its start holds it
    refusals.relay(RefusedError("/models/m", "stale"))
    refusals.start_relay()
    second = os.environ[VAR]
    report["second"] = second
    refusals.relay(RefusedError("/models/m", "second"))
    report["second_read"] = str(refusals.relayed_refusal())
    refusals.end_relay()
elif what == "reader":  # the front end reads only a file it made
    report["read"] = str(refusals.relayed_refusal())
print(json.dumps(report))
"""


def _run(env_path: str | None, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CKPTPUB_REFUSAL_FILE"}
    if env_path is not None:
        env["CKPTPUB_REFUSAL_FILE"] = env_path
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert time.monotonic() - started < 30, "the relay waited on what was planted"
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _outside(tmp: Path) -> Path:
    outside = tmp / "outside.jsonl"
    outside.write_text(OUTSIDE_TEXT)
    return outside


def _planted(kind: str, tmp: Path) -> str:
    """A name the variable is set to: what a careless or hostile environment leaves there."""
    name = tmp / "planted"
    if kind == "symlink to a file":
        os.symlink(_outside(tmp), name)
    elif kind == "dangling symlink":
        os.symlink(tmp / "created-through-the-link", name)
    elif kind == "FIFO":
        os.mkfifo(name)
    elif kind == "folder":
        name.mkdir()
    elif kind == "missing":
        pass
    return str(name)


KINDS = ["symlink to a file", "dangling symlink", "FIFO", "folder", "missing"]


@pytest.mark.parametrize("kind", KINDS)
def test_an_engine_process_never_writes_through_or_waits_on_what_the_variable_names(
    kind: str, tmp_path: Path
) -> None:
    name = _planted(kind, tmp_path)
    _run(name, "worker")
    assert not (tmp_path / "created-through-the-link").exists()
    if kind == "symlink to a file":
        assert (tmp_path / "outside.jsonl").read_text() == OUTSIDE_TEXT
    if kind == "missing":
        assert not os.path.lexists(name)  # nothing is made at a name the engine process was given


@pytest.mark.parametrize("kind", KINDS)
def test_each_engine_start_makes_its_own_relay_file_and_never_touches_an_inherited_name(
    kind: str, tmp_path: Path
) -> None:
    """Two starts in one process, the variable inherited as a planted name, a symlink planted at the
    first start's name after it ended (the issue's case): both relays work, nothing planted is touched."""
    name = _planted(kind, tmp_path)
    target = _outside(tmp_path) if kind != "symlink to a file" else tmp_path / "outside.jsonl"
    report = _run(name, "starts", str(target))
    assert report["first"] != name
    assert report["second"] not in (name, report["first"])
    assert report["first_mode"] == "0o700"
    assert report["first_read"].endswith("first")
    assert report["second_read"].endswith("second")
    assert report["after_end"] is None
    assert report["first_gone"]
    assert not os.path.lexists(report["second"])
    assert not os.path.lexists(os.path.dirname(report["second"]))
    assert os.path.lexists(name) == (kind != "missing")  # the inherited name is left as it was
    assert target.read_text() == OUTSIDE_TEXT
    assert not (tmp_path / "created-through-the-link").exists()
    os.unlink(report["first"])  # the planted symlink is still there: the exit removed only its own file
    os.rmdir(os.path.dirname(report["first"]))


def test_the_front_end_reads_no_refusal_from_a_file_it_did_not_make(tmp_path: Path) -> None:
    """A regular file at the inherited name, holding a forged refusal, is not what an engine said."""
    forged = tmp_path / "forged.jsonl"
    forged.write_text(json.dumps({"message": "ckptpub: refusing to serve /m: forged"}) + "\n")
    assert _run(str(forged), "reader")["read"] == "None"
    assert forged.read_text().endswith('forged"}\n')
