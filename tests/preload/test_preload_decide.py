"""The decision logic as pure functions: no processes, real manifests."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
from ckptpub_vllm.preload import daemon_process
from ckptpub_vllm.preload.decide import Failure, Held, Target, decide, explain_change
from ckptpub_vllm.preload.observe import (
    MAX_NOTE_CHARS,
    MAX_SKIPPED_NOTES,
    ManifestCache,
    manifests_to_compare,
    observe_folder,
    observe_run,
)
from support.checkpoints import flip_byte, locate, with_retired_manifest
from support.preload_helpers import Run, make_checkpoint

import ckptpub

I1, I2 = "blake3:" + "1" * 64, "blake3:" + "2" * 64


def target(folder="/m/a", identity=I1, stamp=(1, 1, 1), step=None):
    return Target(folder=folder, identity=identity, stamp=stamp, step=step)


def held(folder="/m/a", identity=I1, stamp=(1, 1, 1), alive=True):
    return Held(identity=identity, folder=folder, stamp=stamp, pid=123, since=0.0, alive=alive)


def test_decide_table():
    cases = [
        # (held, target, previous, failure, now) -> (action, why)
        ((None, target(), None, None, 0), ("start", "first-preload")),
        ((held(), target(), target(), None, 0), ("keep", "same-identity")),
        ((held(), target(stamp=(2, 2, 2)), target(), None, 0), ("keep", "same-identity-republished")),
        ((held(), target(folder="/m/b"), target(), None, 0), ("keep", "same-identity-new-path")),
        ((held(), target(identity=I2), target(), None, 0), ("replace", "identity-changed")),
        ((held(alive=False), target(), target(), None, 0), ("restart", "daemon-died")),
        ((held(alive=False), target(identity=I2), target(), None, 0), ("start", "daemon-died-new-target")),
        ((held(), Target(error="gone"), target(), None, 0), ("keep", "target-unusable")),
        ((None, Target(error="gone"), None, None, 0), ("wait", "target-unusable")),
        ((held(), target(identity=I2), None, Failure(I2, 1, 100.0, "oom"), 50.0), ("wait", "backoff")),
        ((held(), target(identity=I2), None, Failure(I2, 1, 100.0, "oom"), 150.0), ("replace", "retry")),
        ((None, target(identity=I2), None, Failure(I2, 2, 100.0, "oom"), 150.0), ("start", "retry")),
        # a failure of another identity does not hold back this one
        (
            (held(), target(identity=I2), None, Failure(I1, 3, 1e12, "oom"), 0),
            ("replace", "identity-changed"),
        ),
        ((held(alive=False), target(), None, Failure(I1, 2, 100.0, "exited"), 50.0), ("wait", "backoff")),
        (
            (held(alive=False), target(), None, Failure(I1, 2, 100.0, "exited"), 150.0),
            ("restart", "daemon-died"),
        ),
    ]
    for (h, t, prev, failure, now), expected in cases:
        d = decide(h, t, previous=prev, failure=failure, now=now)
        assert (d.action, d.why) == expected, (h, t, prev, failure, d)
        assert d.reason


def test_explain_change_from_manifests(tmp_path):
    a = tmp_path / "a"
    make_checkpoint(a, seed=1)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    config = json.loads((b / "config.json").read_text())
    config["rope_theta"] = 1.0
    (b / "config.json").write_text(json.dumps(config))
    ckptpub.publish(b)
    c = tmp_path / "c"
    shutil.copytree(a, c)
    shard, start, _ = locate(c, "model.norm.weight")
    flip_byte(shard, start)  # same header, one weight byte differs
    ckptpub.publish(c)
    ma, mb, mc = (ckptpub.read_manifest(p) for p in (a, b, c))
    assert explain_change(ma, mb)[0] == "config-changed"
    why, text = explain_change(ma, mc)
    assert why == "weights-changed"
    assert "model.norm.weight" in text
    assert explain_change(ma, None)[0] == "identity-changed"
    # decide takes what observe read: the two manifests explain the replacement, no file is opened
    cache = ManifestCache()
    h = held(folder=str(a), identity=ma.identity, stamp=None)
    t = observe_folder(str(c), cache)
    decision = decide(h, t, held_manifest=ma, target_manifest=mc)
    assert (decision.action, decision.why) == ("replace", "weights-changed")
    assert manifests_to_compare(h, t, cache) == (ma, mc)
    assert manifests_to_compare(held(folder=str(c), identity=mc.identity), t, cache) == (None, None)


@pytest.mark.parametrize("version", ["ckptpub/1", "ckptpub/2"])
def test_a_target_in_a_retired_format_is_unusable_and_the_daemon_is_kept(tmp_path, version):
    """A folder whose manifest is from before ckptpub/3 (never released) is not read: the target is
    unusable, in the core's one line naming the format and how to publish it again."""
    cache = ManifestCache()
    identity = make_checkpoint(tmp_path / "m", seed=1)
    h = held(folder=str(tmp_path / "m"), identity=identity)
    t = observe_folder(str(with_retired_manifest(tmp_path / "m", version)), cache)
    assert t.identity is None
    assert t.error == (
        f"{tmp_path / 'm'}: {tmp_path / 'm' / 'ckptpub.json'}: format {version!r} is no longer read "
        f"(ckptpub reads 'ckptpub/3'); publish it again: ckptpub publish {tmp_path / 'm'}"
    )
    decision = decide(h, t)
    assert (decision.action, decision.why) == ("keep", "target-unusable")
    assert decision.reason.endswith(f"; keeping the daemon holding {identity}")


def test_observe_folder_follows_symlinks_and_reports_problems(tmp_path):
    cache = ManifestCache()
    identity = make_checkpoint(tmp_path / "m1", seed=1)
    os.symlink("m1", tmp_path / "current")
    t = observe_folder(str(tmp_path / "current"), cache)
    assert t.error is None
    assert t.identity == identity
    assert t.folder == str((tmp_path / "m1").resolve())
    (tmp_path / "bare").mkdir()
    assert "no ckptpub.json" in observe_folder(str(tmp_path / "bare"), cache).error
    assert "no such folder" in observe_folder(str(tmp_path / "missing"), cache).error
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / ckptpub.MANIFEST_NAME).write_text("{not json")
    assert observe_folder(str(tmp_path / "bad"), cache).error


def test_skipped_index_lines_are_noted_briefly_and_counted(tmp_path):
    """Notes go into status.json on every poll: a hostile line's values are cut, extra lines counted."""
    run = Run(tmp_path / "run")
    identity = make_checkpoint(run.root / "checkpoint-10", seed=1)
    run.append(10, "checkpoint-10", identity)
    with open(run.root / "ckptpub-index.jsonl", "a") as handle:
        handle.write(
            json.dumps({"step": 11, "path": "x" * 1_000_000 + "/../..", "identity": identity}) + "\n"
        )
        handle.writelines("not json\n" for _ in range(MAX_SKIPPED_NOTES + 5))
    t = observe_run(str(run.root), ManifestCache())
    assert (t.step, t.identity) == (10, identity)
    assert len(t.skipped) == MAX_SKIPPED_NOTES
    assert t.skipped[0].startswith("run index line 2 skipped: path 'xxx")
    assert max(len(note) for note in t.skipped) < MAX_NOTE_CHARS + 50
    assert t.skipped[-1].endswith("(and 6 more)")


def test_observe_run_newest_usable_step(tmp_path):
    run = Run(tmp_path / "run")
    cache = ManifestCache()
    calls = []
    real_verify = cache.verify
    cache.verify = lambda folder: calls.append(folder) or real_verify(folder)
    assert observe_run(str(run.root), cache).error.endswith("no published step yet")
    i10 = make_checkpoint(run.root / "checkpoint-10", seed=1)
    run.append(10, "checkpoint-10", i10)
    i20 = make_checkpoint(run.root / "checkpoint-20", seed=2)
    run.append(20, "checkpoint-20", i20)
    run.append(30, "checkpoint-30", "blake3:" + "3" * 64)  # rotated away / never written
    t = observe_run(str(run.root), cache)
    assert (t.step, t.identity) == (20, i20)
    assert any("skipped step 30" in n for n in t.notes)
    # --verified-only: a step whose bytes changed after publishing is skipped; verify runs once per manifest
    shard, start, _ = locate(run.root / "checkpoint-20", "model.norm.weight")
    flip_byte(shard, start)
    for _ in range(3):
        t = observe_run(str(run.root), cache, verified_only=True)
        assert (t.step, t.identity) == (10, i10), t
    assert any("ckptpub verify failed" in n and "model.norm.weight" in n for n in t.notes), t.notes
    assert sorted(calls) == sorted({str((run.root / f"checkpoint-{s}").resolve()) for s in (10, 20)})
    # a torn last line (a crashed writer) is ignored
    with open(run.root / "ckptpub-index.jsonl", "a") as handle:
        handle.write('{"step": 40, "path": "checkp')
    assert observe_run(str(run.root), cache).step == 20


def test_build_argv_placeholders_and_passthrough():
    argv = daemon_process.build_argv(
        "numactl -N 0 vllm preload --model {folder} --weight-cache-socket-dir '{socket_dir}'",
        ["--tensor-parallel-size", "2"],
        folder="/m/a b",
        socket_dir="/s/g1",
        identity=I1,
    )
    assert argv == [
        "numactl",
        "-N",
        "0",
        "vllm",
        "preload",
        "--model",
        "/m/a b",
        "--weight-cache-socket-dir",
        "/s/g1",
        "--tensor-parallel-size",
        "2",
    ]
    default = [sys.executable, "-m", "ckptpub_vllm.preload.vllm_launcher", "preload", "--model", "/m"]
    for socket_dir, placed in ((None, []), ("/s", ["--weight-cache-socket-dir", "/s"])):
        assert daemon_process.build_argv(
            daemon_process.DEFAULT_COMMAND,
            ["--dtype", "bfloat16"],
            folder="/m",
            socket_dir=socket_dir,
            identity=I1,
        ) == [*default, *placed, "--dtype", "bfloat16"]
    with pytest.raises(ValueError, match="give the directory with --socket-dir"):
        daemon_process.build_argv("w {socket_dir} {folder}", [], folder="/m", socket_dir=None, identity=I1)


def test_daemon_reports_written_in_a_process_are_what_the_supervisor_reads(tmp_path):
    """One format for the daemon's reports: written by ``daemon_reports.report`` in another process (as the
    plugin writes them in a daemon), read by the supervisor's ``LogWatch``; anything else is not a report."""
    import re
    import subprocess

    from ckptpub_vllm.shared import daemon_reports

    log = tmp_path / "daemon.log"
    script = (
        "from ckptpub_vllm.shared import daemon_reports as r\n"
        "r.report(r.KEYED, folder='/m/x', identity='I')  # not enabled: an engine writes nothing\n"
        "r.enable()\n"
        "r.report(r.KEYED, folder='/m/\\nx', identity='I')\n"
        "r.report(r.VERIFIED, folder='/m/x', identity='I', tensors=3)\n"
        "r.report(r.WAITING, identity='I', socket='/s/a.sock')\n"
        "r.report(r.SERVING, identity='I', socket='/s/a.sock')\n"
        "r.report(r.CLIENT, client_pid=1, client_start=None)\n"
        'print(\'INFO ckptpub-daemon-report {"event": "keyed", "pid": 1, "identity": "X"}\')\n'
    ).replace("'I'", repr(I1))
    with open(log, "wb") as out:
        subprocess.run([sys.executable, "-c", script], stdout=out, stderr=out, check=True)
    watch = daemon_process.LogWatch(str(log), re.compile(daemon_process.READY_PATTERN))
    watch.poll()
    (pid,) = watch.keyed
    assert watch.keyed == {pid: I1}
    assert watch.verified == {pid: I1}
    assert watch.serving == {pid: "/s/a.sock"}
    assert not watch.waiting
    assert watch.identities() == [I1, I1, I1]  # the line not at a line start is no report
    assert watch.live_clients() == [1]
    for line in ("", "ckptpub-daemon-report", "ckptpub-daemon-report {", 'ckptpub-daemon-report {"pid": 1}'):
        assert daemon_reports.parse(line) is None


@pytest.mark.parametrize(
    ("line", "code", "permanent"),
    [
        ("ModuleNotFoundError: No module named 'vllm'", 1, "the daemon cannot import what it needs"),
        (
            "(vllm-weight-cache-target-0 pid=12) ImportError: libcuda.so.1: cannot open shared object",
            1,
            "the daemon cannot import what it needs",
        ),
        (
            "vllm.model_executor.model_loader.weight_cache.protocol.UnsupportedPlatformForIPCError: "
            "platform 'cpu' does not support CUDA IPC weight sharing",
            1,
            "this platform cannot share weights with engines",
        ),
        (
            "vllm preload: error: unrecognized arguments: --no-such-flag",
            2,
            "vllm preload refused its arguments",
        ),
        ("torch.OutOfMemoryError: CUDA out of memory", 1, None),
        ("ckptpub.serving.RefusedError: ckptpub: refusing to serve /m: tensor 'x' differs", 1, None),
        ("vllm preload: error: something", 1, None),  # not a usage exit code
    ],
)
def test_failures_that_cannot_heal_are_told_from_those_that_can(line, code, permanent):
    from ckptpub_vllm.preload import failures

    reason = failures.permanent_reason(failures.exception_line(line), code)
    assert (reason is None) if permanent is None else reason.startswith(permanent), reason
