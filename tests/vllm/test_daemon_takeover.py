"""vLLM's REAL daemon behind the CPU shim: one manifest per daemon, found by engines with no socket option.

One supervisor (``python -m ckptpub preload FOLDER``, default daemon command: vLLM's own
``vllm preload``) on one folder, and one engine runner, act out, in order:

1. **A manifest swapped between the daemon's key and its load** (issue 26, item 1).
   The folder holds checkpoint A; the first daemon computes its key in vLLM's
   ``WeightCacheDaemon.__init__`` and is held there by the shim's test hook
   (``CKPTPUB_SIM_PAUSE_DIR``: a deterministic window, no sleep race) while the test
   puts B's manifest and B's changed shard in place (same headers, other bytes). The
   daemon was keyed by A, so it must load and report A or refuse: B's bytes against A's
   manifest are refused by tensor name, and the supervisor never holds it. (Before the
   fix the load read the manifest again, verified B and served it under A's key.)
2. The supervisor then preloads the folder as it now is, B, on vLLM's default socket
   path. Engines are given **no socket option** (their ``TMPDIR`` is the supervisor's,
   so vLLM's default socket folder is the same): one on the folder maps B's weights
   (vLLM's ``Mapped`` line, B's tokens); one pinned to A on a pristine copy of A is
   refused in one line naming both identities (issue 21, item 4).
3. **A swap** (the folder back to A): the new daemon loads while the old one serves,
   waits for the default socket path, takes it over once the old one handed it over,
   and refuses a hand-over meant for the old one that arrives after that (a CI run
   once saw the supervisor's late request stop the new daemon: no daemon for 300 s);
   the old one, which the running engine runner mapped weights from, is kept until that
   runner exits (issue 21, item 2; on CPU the shim ships tensors by value, but the
   supervisor's rule is the same); an engine started after the swap maps A.

Real: the supervisor, ``vllm preload``, ``WeightCacheDaemon``, the plugin in the daemon and
the engines, vLLM's ``IpcModelLoader``. Simulated: CUDA IPC and the device UUID (the shim).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from ckptpub_vllm.preload.daemon_process import send_command
from ckptpub_vllm.shared import daemon_reports
from ckptpub_vllm.shared.daemon_reports import HAND_OVER_COMMAND
from support.preload_helpers import SupervisorProc, pid_alive, ready_with, wait_for
from support.safetensors_files import find_tensor_file
from support.vllm_engine_helpers import DAEMON_ARGS, SHIM_ENV, TAMPERED_TENSOR, EngineRunner

import ckptpub

pytestmark = pytest.mark.slow  # vLLM engines and the weight-cache daemon


def _put(source: str, folder: Path, names: list[str]) -> None:
    """Replace ``names`` in ``folder`` by ``source``'s files, each by an atomic rename (as publish does)."""
    for name in names:
        staged = folder / f".{name}.staged"
        shutil.copyfile(os.path.join(source, name), staged)
        os.replace(staged, folder / name)


def _reports(log: Path) -> list[dict]:
    return [r for r in map(daemon_reports.parse, log.read_text(errors="replace").splitlines()) if r]


@pytest.fixture(scope="module")
def scene(models, tmp_path_factory):
    a_dir, b_dir = models["v1"], models["republished"]  # same headers; model.norm.weight differs
    a, b = ckptpub.read_manifest(a_dir).identity, ckptpub.read_manifest(b_dir).identity
    root = tmp_path_factory.mktemp("takeover")
    folder = Path(shutil.copytree(a_dir, root / "current"))
    pristine = str(shutil.copytree(a_dir, root / "pristine-a"))
    swapped = [os.path.basename(find_tensor_file(a_dir, TAMPERED_TENSOR)), ckptpub.MANIFEST_NAME]
    pause = root / "pause"
    pause.mkdir()
    (pause / "armed").touch()
    tmpdir = tempfile.mkdtemp(prefix="ckto", dir="/tmp")  # vLLM's default socket folder goes under it
    env = {**SHIM_ENV, "TMPDIR": tmpdir}
    sup = SupervisorProc(
        root,
        [str(folder)],
        env={**env, "CKPTPUB_SIM_PAUSE_DIR": str(pause)},
        daemon_cmd=None,
        extra_opts=["--interval", "0.5", "--ready-timeout", "900", "--retry-delay", "600"],
        passthrough=DAEMON_ARGS,
    )
    sup.start()
    runner = None
    try:
        wait_for(lambda: (pause / "paused").exists(), 600, "the first daemon keyed and paused", sup)
        _put(b_dir, folder, swapped)  # between the key and the load
        (pause / "paused").unlink()
        first = wait_for(ready_with(sup, b), 900, "a daemon holding the folder as it is now, B", sup)
        after_swap = root / "swapped"
        jobs = [
            {"model": a_dir, "load_format": "auto"},
            {"model": b_dir, "load_format": "auto"},
            {
                "model": pristine,
                "load_format": "manifest_cache",
                "extra": {"expect_identity": a, "fallback": False},
            },
            {"model": str(folder), "load_format": "manifest_cache", "extra": {"fallback": False}},
            {"wait_for": str(after_swap)},
            {"model": str(folder), "load_format": "manifest_cache", "extra": {"fallback": False}},
        ]
        runner = EngineRunner(jobs, root / "engines.log", env=env)
        wait_for(lambda: len(runner.results()) >= 4, 1200, "the engines before the swap", sup)
        _put(a_dir, folder, swapped)  # the swap: the folder holds A again
        second = wait_for(ready_with(sup, a), 900, "the new daemon, holding A", sup)
        # A hand-over meant for the old daemon that arrives after the new one took the path over
        # (as a supervisor's late request could): the new daemon refuses it and keeps serving.
        old_log = Path(first["held"]["log"])
        (old_process,) = {r["pid"] for r in _reports(old_log) if r["event"] == "serving"}
        (path,) = second["held"]["sockets"]
        late_ask = send_command(path, HAND_OVER_COMMAND, pid=old_process)
        kept = wait_for(lambda: (s := sup.status())["retired"] and s, 60, "the old daemon retired", sup)
        after_swap.touch()
        results, log = runner.finish(timeout=1200)
        drained = wait_for(
            lambda: (s := sup.status())["retired"] == [] and s, 120, "the old daemon stopped", sup
        )
        yield {
            "a": a,
            "b": b,
            "folder": str(folder),
            "sup": sup,
            "first": first,
            "second": second,
            "kept": kept,
            "drained": drained,
            "late_ask": (late_ask, old_process, path),
            "runner_pid": runner.proc.pid,
            "jobs": jobs,
            "results": results,
            "job_logs": log.split("CKPTPUB_RESULT "),
        }
        assert sup.terminate(timeout=120) == 0
    finally:
        if runner is not None:
            runner.kill()
        sup.cleanup()
        shutil.rmtree(tmpdir, ignore_errors=True)


def test_a_daemon_loads_only_the_manifest_its_key_was_read_from(scene):
    sup, a, b = scene["sup"], scene["a"], scene["b"]
    first_log = sup.state_dir / "logs" / "daemon-1.log"
    reports = _reports(first_log)
    assert [(r["event"], r["identity"]) for r in reports] == [
        ("keyed", a)
    ]  # nothing verified, nothing served
    text = first_log.read_text(errors="replace")
    assert f"ckptpub: refusing to serve {scene['folder']}: tensor '{TAMPERED_TENSOR}'" in text
    failed = [e for e in sup.decisions() if e.get("why") == "failed"]
    assert len(failed) == 1
    assert f"preload of {a}" in failed[0]["reason"]
    assert "refusing to serve" in failed[0]["reason"] or "exited" in failed[0]["reason"]
    ready = [e["daemon"] for e in sup.decisions() if e.get("why") == "ready"]
    assert [(d["generation"], d["identity"]) for d in ready] == [(2, b), (3, a)]  # A's first daemon never
    for generation, identity in ((2, b), (3, a)):
        held = _reports(sup.state_dir / "logs" / f"daemon-{generation}.log")
        assert {r["identity"] for r in held if "identity" in r} == {identity}
        assert {"keyed", "verified", "serving"} <= {r["event"] for r in held}


def test_an_engine_pinned_elsewhere_is_refused_naming_both_identities(scene):
    pinned = scene["results"][2]
    assert "tokens" not in pinned
    assert f"the daemon holds checkpoint {scene['b']} (loaded from {scene['folder']})" in pinned["error"]
    assert f"this engine asked for {scene['a']}" in pinned["error"]
    assert "fallback is false, so nothing is loaded" in pinned["error"]
    assert "Mapped " not in scene["job_logs"][2]


def test_engines_with_no_socket_option_map_the_supervisors_daemon_before_and_after_a_swap(scene):
    results, logs, jobs = scene["results"], scene["job_logs"], scene["jobs"]
    auto_a, auto_b = results[0]["tokens"], results[1]["tokens"]
    assert auto_a != auto_b
    for index, tokens in ((3, auto_b), (5, auto_a)):
        assert not {"socket_dir", "socket_path"} & set(jobs[index]["extra"])
        assert results[index].get("tokens") == tokens, (results[index], logs[index][-3000:])
        assert "Mapped " in logs[index]
        assert "tensors from the weight cache daemon" in logs[index]
        assert "loaded and verified" not in logs[index]  # not from disk
    assert scene["first"]["socket_dir"] == scene["second"]["socket_dir"]  # one path, taken over


def test_a_hand_over_meant_for_the_old_daemon_is_refused_by_the_new_one(scene):
    delivered, old_process, path = scene["late_ask"]
    assert delivered
    new_log = Path(scene["second"]["held"]["log"]).read_text(errors="replace")
    assert f"a hand-over of {path} asked of daemon pid {old_process} reached pid" in new_log
    assert "which keeps serving" in new_log
    new_reports = _reports(Path(scene["second"]["held"]["log"]))
    assert daemon_reports.HANDED_OVER not in {r["event"] for r in new_reports}
    # and the engine started after it maps the new daemon's weights: the test above


def test_the_old_daemon_is_kept_while_an_engine_it_served_runs(scene):
    sup, kept = scene["sup"], scene["kept"]
    (retired,) = kept["retired"]
    assert (retired["pid"], retired["identity"]) == (scene["first"]["held"]["pid"], scene["b"])
    assert retired["engines"] == [scene["runner_pid"]]
    assert not pid_alive(retired["pid"])  # stopped once the runner exited
    whys = [e.get("why") for e in sup.decisions()]
    assert whys.index("hand-over") < whys.index("kept-for-engines") < whys.index("stopped-old")
