"""vLLM's REAL weight-cache daemon, end to end: ``ckptpub preload --follow`` over a real Trainer run,
then ``manifest_cache`` engines mapping from the daemon it holds.

Real: the supervisor (``python -m ckptpub preload``) with its default daemon command
(``python -m ckptpub_vllm.preload.vllm_launcher preload``, i.e. vLLM's own ``vllm preload``
and ``WeightCacheDaemon``), a Trainer run with ``PublishCallback``, vLLM CPU engines with
``--load-format manifest_cache``, vLLM's ``IpcModelLoader`` request/mismatch/fallback logic.
Simulated, because this machine has no GPU: CUDA IPC and the device UUID, through the
test-only shim ``tests/daemon_sim/sitecustomize.py`` put on ``PYTHONPATH`` of the
supervisor (hence of the daemons it starts) and of the engine runner. Its docstring
lists exactly what it replaces; it is the only addition to the environment.

One supervisor and one engine runner serve every test here (module fixtures): a daemon
start takes 20-60 s on two cores, an engine start 5-25 s.

The run: steps 5, 10, 15; lr 0 after step 10, so checkpoint-15 re-saves checkpoint-10's
bytes. Expected supervisor decisions: first-preload (5), weights-changed (10), keep (15):
two daemons, exactly one re-preload.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ckptpub_vllm.shared import daemon_reports
from support.preload_helpers import SupervisorProc, wait_for
from support.vllm_engine_helpers import DAEMON_ARGS, SHIM, SHIM_ENV, TAMPERED_TENSOR, run_engines

import ckptpub

pytestmark = pytest.mark.slow  # a Trainer run, the weight-cache daemon and vLLM engines

HERE = Path(__file__).parent
PLATFORM_LINE = "ckptpub: vllm_launcher pid {pid}: vLLM platform CpuPlatform (device cpu)"


def shim_banner(pid: int) -> str:
    """The shim's start line for ``pid``.

    Read from the shim's source: importing it here would install its hook in pytest.
    """
    tree = ast.parse((SHIM / "sitecustomize.py").read_text())
    banner = next(
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "BANNER" for t in node.targets)
    )
    return f"{banner} {pid} "


@pytest.fixture(scope="module")
def follow(tmp_path_factory):
    """The supervisor following a paced Trainer run; yields while it holds the last daemon."""
    root = tmp_path_factory.mktemp("real-daemon")
    run_dir = root / "run"
    run_dir.mkdir()
    # the state folder holds no socket: any path length works (pytest's are long)
    state = root / "state"
    sup = SupervisorProc(
        root,
        ["--follow", str(run_dir)],
        env=SHIM_ENV,  # and a TMPDIR of its own, under which vLLM's default socket folder is
        state_dir=state,
        daemon_cmd=None,
        extra_opts=["--interval", "0.5", "--ready-timeout", "900", "--retry-delay", "600"],
        passthrough=DAEMON_ARGS,
    )
    sup.start()
    try:
        # the supervisor asks vLLM whether a daemon can run here before its first poll: wait for that poll
        wait_for(lambda: sup.decisions() and sup.status(), 300, "the supervisor's first poll", sup)
        train = subprocess.run(
            [sys.executable, str(HERE / "follow_train.py"), str(run_dir), str(state)],
            capture_output=True,
            text=True,
            timeout=2400,
        )
        assert train.returncode == 0, (
            f"training run failed:\n{train.stdout[-2000:]}\n{train.stderr[-3000:]}\n"
            f"supervisor:\n{sup.stderr()[-3000:]}"
        )
        yield {
            "sup": sup,
            "run": run_dir,
            "root": root,
            "status": sup.status(),
            "env": {**SHIM_ENV, "TMPDIR": sup.tmpdir},
        }
        assert sup.terminate(timeout=120) == 0
    finally:
        sup.cleanup()


def _identity(folder) -> str:
    return ckptpub.read_manifest(folder).identity


def test_follow_re_preloads_exactly_once_per_identity_change(follow):
    run, sup = follow["run"], follow["sup"]
    a, b, b_again = (_identity(run / f"checkpoint-{step}") for step in (5, 10, 15))
    assert a != b
    assert b_again == b  # checkpoint-15: checkpoint-10's bytes under a new step folder

    decisions = [e for e in sup.decisions() if e.get("event") == "decision"]
    assert [(e["action"], e["why"], e["target"].get("step")) for e in decisions] == [
        ("wait", "target-unusable", None),  # started before the run's first save
        ("start", "first-preload", 5),
        ("replace", "weights-changed", 10),
        ("keep", "same-identity-new-path", 15),
    ]
    launched = [e for e in sup.decisions() if e.get("why") == "launched"]
    assert len(launched) == 2  # the first preload and exactly one re-preload

    status = follow["status"]
    assert status["state"] == "ready"
    assert status["held"]["identity"] == b
    assert status["target"]["step"] == 15
    assert status["held"]["folder"] == str(
        (run / "checkpoint-10").resolve()
    )  # kept, not reloaded from step 15
    logs = sorted((sup.state_dir / "logs").glob("daemon-*.log"))
    assert [p.name for p in logs] == ["daemon-1.log", "daemon-2.log"]
    for log, identity in zip(logs, (a, b), strict=True):
        text = log.read_text(errors="replace")
        reports = [r for r in map(daemon_reports.parse, text.splitlines()) if r is not None]
        launcher = next(
            e["daemon"]["pid"]
            for e in sup.decisions()
            if e.get("why") == "launched" and e["daemon"]["identity"] == identity
        )
        # from inside vLLM's daemon child, not the launcher: keyed, verified, serving, one identity
        assert {r["event"] for r in reports} >= {"keyed", "verified", "serving"}
        assert {r.get("identity") for r in reports if "identity" in r} == {identity}
        assert all(r["pid"] != launcher for r in reports)
        assert "Weight cache daemon READY" in text
        assert "Weight cache target daemon rank 0 serving on" in text


def test_launched_daemons_run_on_cpu_platform_with_the_shim(follow):
    """The default daemon command keeps CpuPlatform in the launcher and in vLLM's daemon child
    (the bug was UnspecifiedPlatform: SIGILL without AVX-512), and the shim was active in both."""
    log = (follow["sup"].state_dir / "logs" / "daemon-2.log").read_text(errors="replace")
    launcher = follow["status"]["held"]["pid"]
    child = int(log.split("(vllm-weight-cache-target-0 pid=", 1)[1].split(")", 1)[0])
    for pid in (launcher, child):
        assert PLATFORM_LINE.format(pid=pid) in log
        assert shim_banner(pid) in log
    assert "UnspecifiedPlatform" not in log


@pytest.fixture(scope="module")
def engines(follow):
    """Engines against the daemon now held (checkpoint-10's identity), one runner process."""
    run, root = follow["run"], follow["root"]
    held, earlier = run / "checkpoint-10", run / "checkpoint-5"
    served = run / "checkpoint-15"  # same identity, another folder

    from support.safetensors_files import copy_with_zeroed_tensor

    # same layout (safetensors headers byte for byte), different bytes
    tampered = copy_with_zeroed_tensor(
        str(served), str(root / "tampered"), TAMPERED_TENSOR
    )  # keeps the manifest
    edit = shutil.copytree(tampered, str(root / "edit"))
    ckptpub.publish(edit)  # a re-published edit
    finetune = copy_with_zeroed_tensor(str(held), str(root / "finetune"), "lm_head.weight")
    ckptpub.publish(finetune, provenance={"base_identity": _identity(held)})  # a fine-tune of the same base
    # no socket option: engines find the daemon where vLLM looks by default (under their TMPDIR)
    jobs = {
        "held_auto": (held, "auto", {}),
        "served_mapped": (served, "manifest_cache", {"fallback": False}),
        "tampered_mapped": (tampered, "manifest_cache", {"fallback": False}),
    }
    for name, folder in (("earlier", earlier), ("finetune", finetune), ("edit", edit)):
        jobs[f"{name}_refused"] = (folder, "manifest_cache", {"fallback": False})
        jobs[f"{name}_fallback"] = (folder, "manifest_cache", {"fallback": True})
    specs = [
        {"model": str(folder), "load_format": fmt, "extra": extra} for folder, fmt, extra in jobs.values()
    ]
    results, log = run_engines(
        specs, env=follow["env"], timeout=1800
    )  # 9 engine starts, on a loaded machine too
    per_job = log.split("CKPTPUB_RESULT ")  # the runner prints each result after the job's own log lines
    folders = {name: str(folder) for name, (folder, _, _) in jobs.items()}
    return {
        name: {**result, "log": per_job[i], "folder": folders[name]}
        for i, (name, result) in enumerate(zip(jobs, results, strict=True))
    }


def _same_headers(*folders) -> bool:
    def headers(folder):
        out = []
        for shard in sorted(Path(folder).glob("*.safetensors")):
            data = shard.read_bytes()
            out.append((shard.name, data[: 8 + int.from_bytes(data[:8], "little")]))
        return out

    return all(headers(f) == headers(folders[0]) for f in folders[1:])


def test_engine_maps_the_daemons_weights(engines, follow):
    """vLLM's "Mapped" line, and tokens: a copy whose disk bytes generate other tokens (one tensor zeroed,
    the held identity's manifest kept) generates the daemon's tokens, so its weights came from the daemon."""
    reference = engines["held_auto"]["tokens"]
    for name in ("served_mapped", "tampered_mapped"):
        job = engines[name]
        assert job.get("tokens") == reference, (name, job.get("error"), job["log"][-3000:])
        assert "Mapped " in job["log"]
        assert "tensors from the weight cache daemon" in job["log"]
        assert "loaded and verified" not in job["log"]  # no disk load
    edit_tokens = engines["edit_fallback"]["tokens"]  # the tampered folder's bytes, loaded from disk
    assert edit_tokens != reference
    mapped_line = next(line for line in engines["tampered_mapped"]["log"].splitlines() if "Mapped " in line)
    print(
        f"\nreal daemon: {mapped_line.strip()}\n  daemon's tokens (mapped, also checkpoint-10 from disk): "
        f"{reference}\n  the tampered bytes from disk: {edit_tokens}"
    )
    assert _same_headers(
        engines["held_auto"]["folder"],
        engines["tampered_mapped"]["folder"],
        engines["edit_fallback"]["folder"],
        engines["finetune_fallback"]["folder"],
    )


@pytest.mark.parametrize("name", ["earlier", "finetune", "edit"])
def test_other_identity_is_never_mapped(engines, name):
    """A later/earlier step, a fine-tune of the same base, a re-published edit: refused with
    ``fallback: false``, a verified disk load with ``fallback: true`` (its own tokens, not the daemon's)."""
    refused, fallback = engines[f"{name}_refused"], engines[f"{name}_fallback"]
    assert "tokens" not in refused, refused
    held = _identity(engines["held_auto"]["folder"])
    asked = f"the daemon holds checkpoint {held} (loaded from "
    assert asked in refused["error"]
    assert f"this engine asked for {_identity(refused['folder'])}" in refused["error"]
    assert "fallback is false" in refused["error"], refused
    assert f"{asked}" in fallback["log"]
    assert "falling back to a verified disk load" in fallback["log"]
    assert "Mapped " not in refused["log"]
    assert "Mapped " not in fallback["log"]
    assert fallback.get("tokens"), fallback.get("error")
    assert fallback["tokens"] != engines["held_auto"]["tokens"]
    verified = f"of {fallback['folder']} from disk in"
    line = next(
        (
            logged
            for logged in fallback["log"].splitlines()
            if "ckptpub: loaded and verified" in logged and verified in logged
        ),
        "",
    )
    assert line.endswith(f"identity {_identity(fallback['folder'])}"), fallback["log"][-3000:]
