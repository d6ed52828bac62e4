"""Real processes: the supervisor (``python -m ckptpub preload``) and stand-in daemons it spawns.

Crash and signal behaviour, adoption, failed preloads, the status command, and the
key being computed inside the spawned daemon process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

from ckptpub_vllm.preload.daemon_process import send_command
from ckptpub_vllm.preload.status import write_json
from ckptpub_vllm.shared import daemon_reports
from support.checkpoints import flip_byte, locate
from support.preload_helpers import SupervisorProc, make_checkpoint, pid_alive, ready_with, wait_for

import ckptpub
from ckptpub._filesystem.model_files import read_layout
from tests.preload.standin_daemon import read_message


def _status_cli(state_dir, *extra):
    return subprocess.run(
        [sys.executable, "-m", "ckptpub", "preload", "--status", "--state-dir", str(state_dir), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _flip_link(link, target):
    tmp = f"{link}.tmp"
    os.symlink(target, tmp)
    os.replace(tmp, link)  # atomic, as an operator's `ln -sfn` + `mv -T` would do


def _outcomes(sup, why):
    return [e for e in sup.decisions() if e.get("event") == "outcome" and e.get("why") == why]


def test_key_is_computed_inside_the_spawned_daemon_from_the_manifest(tmp_path):
    """Two checkpoints with byte-identical safetensors headers (vLLM's own key would be equal) and one
    differing weight byte: the daemon process, spawned by the supervisor, keys them apart by manifest."""
    a = tmp_path / "a"
    ia = make_checkpoint(a, seed=1)
    b = tmp_path / "b"
    os.system(f"cp -r {a} {b}")
    shard, start, _ = locate(b, "model.norm.weight")
    flip_byte(shard, start)
    ib = ckptpub.publish(b).identity
    header = slice(0, read_layout(str(a / "model.safetensors"), "a").header_size)  # length prefix too
    assert (a / "model.safetensors").read_bytes()[header] == (b / "model.safetensors").read_bytes()[header]
    assert ia != ib

    os.symlink("a", tmp_path / "serve")
    sup = SupervisorProc(
        tmp_path, [str(tmp_path / "serve")], passthrough=["--tensor-parallel-size", "1"]
    ).start()
    try:
        wait_for(ready_with(sup, ia), 30, "daemon on a", sup)
        _flip_link(tmp_path / "serve", "b")
        wait_for(ready_with(sup, ib), 30, "daemon on b", sup)
        assert sup.terminate() == 0
    finally:
        sup.cleanup()
    starts = [r for r in sup.standin() if r["event"] == "start"]
    assert [r["identity"] for r in starts] == [ia, ib]
    for rec, folder, identity in zip(starts, (a, b), (ia, ib), strict=True):
        assert rec["pid"] != sup.proc.pid
        assert rec["ppid"] == sup.proc.pid
        assert rec["key_function"] == "ckptpub_vllm.shared.key.checkpoint_key"
        assert rec["identity"] == ckptpub.read_manifest(folder).identity == identity
        assert rec["folder"] == str(
            folder.resolve()
        )  # the symlink is resolved: the daemon gets a stable folder
        assert rec["env_identity"] == identity
        assert rec["extra"] == ["--tensor-parallel-size", "1"]  # pass-through arguments reach the daemon
    replace = [e for e in sup.decisions() if e.get("action") == "replace"]
    assert len(replace) == 1
    assert replace[0]["why"] == "weights-changed"
    assert "model.norm.weight" in replace[0]["reason"]


def test_fixed_target_in_place_events(tmp_path):
    """MODEL_DIR re-published in place: same bytes -> keep; changed weights or config -> replace."""
    m = tmp_path / "model"
    i1 = make_checkpoint(m, seed=1)
    sup = SupervisorProc(tmp_path, [str(m)]).start()
    try:
        wait_for(ready_with(sup, i1), 30, "first", sup)
        n = len(sup.decisions())
        ckptpub.publish(m)  # re-publish, same bytes
        wait_for(
            lambda: any(e.get("why") == "same-identity-republished" for e in sup.decisions()[n:]),
            30,
            "republish decision",
            sup,
        )
        shard, start, _ = locate(m, "model.layers.0.self_attn.q_proj.weight")
        flip_byte(shard, start + 100)  # changed in place, not yet published: the manifest still says i1
        time.sleep(0.5)
        assert sup.status()["held"]["identity"] == i1
        i2 = ckptpub.publish(m).identity
        wait_for(ready_with(sup, i2), 30, "after weights change", sup)
        config = json.loads((m / "config.json").read_text())
        config["rope_theta"] = 10000.0
        (m / "config.json").write_text(json.dumps(config))
        i3 = ckptpub.publish(m).identity
        wait_for(ready_with(sup, i3), 30, "after config change", sup)
        assert sup.terminate() == 0
    finally:
        sup.cleanup()
    whys = [e["why"] for e in sup.decisions() if e.get("event") == "decision"]
    assert whys == ["first-preload", "same-identity-republished", "weights-changed", "config-changed"]
    assert [r["identity"] for r in sup.standin() if r["event"] == "start"] == [i1, i2, i3]


def test_supervisor_killed_and_restarted_adopts_the_running_daemon(tmp_path):
    m = tmp_path / "model"
    identity = make_checkpoint(m, seed=1)
    first = SupervisorProc(tmp_path, [str(m)]).start()
    second = None
    try:
        status = wait_for(ready_with(first, identity), 30, "ready", first)
        daemon_pid = status["held"]["pid"]
        first.kill()  # SIGKILL: no clean-up at all
        assert pid_alive(daemon_pid)  # the daemon is in its own session: it survives its supervisor
        second = SupervisorProc(tmp_path, [str(m)]).start()
        wait_for(lambda: _outcomes(second, "adopted"), 30, "adoption", second)
        status = wait_for(
            lambda: (s := ready_with(second, identity)()) and s["supervisor_pid"] == second.proc.pid and s,
            30,
            "ready after adoption",
            second,
        )
        assert status["held"]["pid"] == daemon_pid
        assert status["supervisor_pid"] == second.proc.pid
        time.sleep(0.5)  # a few polls: still the same daemon, nothing reloaded
        starts = [r for r in second.standin() if r["event"] == "start"]
        assert len(starts) == 1
        assert starts[0]["pid"] == daemon_pid
        assert "adopted, not reloaded" in _outcomes(second, "adopted")[0]["reason"]
        # SIGTERM to the new supervisor stops the adopted daemon (not its child) cleanly
        assert second.terminate() == 0
        wait_for(lambda: not pid_alive(daemon_pid), 15, "adopted daemon stopped")
        assert [r["during"] for r in second.standin() if r["event"] == "stop"] == ["serve"]
    finally:
        first.cleanup()
        if second is not None:
            second.cleanup()


def _assert_not_adopted(tmp_path, model, identity, stranger, record, reason):
    """A supervisor started over ``record`` (naming the live process ``stranger``) starts a
    fresh daemon for ``identity``, never adopts or signals ``stranger``, and says ``reason``."""
    sup = None
    try:
        write_json(str(tmp_path / "state" / "daemon.json"), record)
        sup = SupervisorProc(tmp_path, [str(model)]).start()
        status = wait_for(ready_with(sup, identity), 30, "fresh daemon", sup)
        assert status["held"]["pid"] != stranger.pid
        assert stranger.poll() is None
        assert reason in _outcomes(sup, "not-adopted")[0]["reason"]
        assert sup.terminate() == 0
        return status
    finally:
        stranger.kill()
        stranger.wait()
        if sup is not None:
            sup.cleanup()


def test_restart_does_not_adopt_a_reused_pid(tmp_path):
    m = tmp_path / "model"
    identity = make_checkpoint(m, seed=1)
    (tmp_path / "state").mkdir()
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    # a record naming a live process that is not our daemon (as after a reboot and pid reuse)
    record = {
        "pid": stranger.pid,
        "identity": identity,
        "folder": str(m),
        "argv": ["vllm", "preload", "--model", str(m)],
        "generation": 3,
        "log": str(tmp_path / "state" / "logs" / "daemon-3.log"),
    }
    status = _assert_not_adopted(tmp_path, m, identity, stranger, record, "another command")
    assert status["held"]["generation"] == 4


def test_restart_does_not_adopt_a_daemon_started_for_another_identity(tmp_path):
    """A live daemon whose command line matches the record but whose environment names another identity."""
    import shlex

    from support.preload_helpers import STANDIN_CMD

    m = tmp_path / "model"
    identity = make_checkpoint(m, seed=1)
    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True)
    argv = [
        a.replace("{folder}", str(m)).replace("{socket_dir}", str(tmp_path / "other-sockets"))
        for a in shlex.split(STANDIN_CMD)
    ]
    log = state / "logs" / "daemon-1.log"
    other = "blake3:" + "0" * 64
    with open(log, "wb") as out:
        daemon = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={
                **os.environ,
                "CKPTPUB_PRELOAD_IDENTITY": other,
                "STANDIN_RECORD": str(tmp_path / "manual.jsonl"),
            },
        )
    try:
        wait_for(lambda: "READY" in log.read_text(), 30, "manual daemon ready")
    except BaseException:
        daemon.kill()
        daemon.wait()
        raise
    record = {
        "pid": daemon.pid,
        "identity": identity,
        "folder": str(m),
        "argv": argv,
        "generation": 1,
        "log": str(log),
    }
    _assert_not_adopted(tmp_path, m, identity, daemon, record, f"not started for {identity}")


def test_daemon_that_dies_is_restarted_for_the_same_identity(tmp_path):
    m = tmp_path / "model"
    identity = make_checkpoint(m, seed=1)
    sup = SupervisorProc(
        tmp_path, [str(m)], env={"STANDIN_CRASH_AFTER_S": "0.3", "STANDIN_CRASH_ONCE": str(tmp_path)}
    ).start()
    try:
        # the first daemon crashes by itself 0.3 s after READY (exit 9); the second is killed from outside
        wait_for(lambda: _outcomes(sup, "daemon-exited"), 30, "first crash", sup)
        status = wait_for(
            lambda: (
                (s := ready_with(sup, identity)())
                and len([r for r in sup.standin() if r["event"] == "ready"]) == 2
                and s
            ),
            30,
            "restart",
            sup,
        )
        os.killpg(status["held"]["pid"], signal.SIGKILL)
        wait_for(lambda: len(_outcomes(sup, "daemon-exited")) == 2, 30, "second death", sup)
        wait_for(
            lambda: len([r for r in sup.standin() if r["event"] == "ready"]) == 3, 30, "second restart", sup
        )
        wait_for(ready_with(sup, identity), 30, "ready again", sup)
        assert sup.terminate() == 0
    finally:
        sup.cleanup()
    starts = [r for r in sup.standin() if r["event"] == "start"]
    assert [r["identity"] for r in starts] == [identity] * 3
    deaths = _outcomes(sup, "daemon-exited")
    assert "code 9" in deaths[0]["reason"]
    assert "simulated crash" in deaths[0]["reason"]
    assert "code -9" in deaths[1]["reason"]
    restarts = [e for e in sup.decisions() if e.get("action") == "restart"]
    assert [e["why"] for e in restarts] == ["daemon-died", "daemon-died"]


def test_failed_preload_keeps_old_daemon_and_says_so(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    ia, ib = make_checkpoint(a, seed=1), make_checkpoint(b, seed=2)
    os.symlink("a", tmp_path / "serve")
    sup = SupervisorProc(
        tmp_path, [str(tmp_path / "serve")], env={"STANDIN_FAIL": ib}, extra_opts=["--retry-delay", "30"]
    ).start()
    try:
        status = wait_for(ready_with(sup, ia), 30, "first", sup)
        old_pid = status["held"]["pid"]
        _flip_link(tmp_path / "serve", "b")
        status = wait_for(lambda: (s := sup.status()).get("state") == "failed" and s, 30, "failed state", sup)
        assert status["held"]["identity"] == ia
        assert status["held"]["pid"] == old_pid
        assert pid_alive(old_pid)
        assert status["target"]["identity"] == ib
        assert "simulated load failure" in status["last_error"]
        human = _status_cli(sup.state_dir)
        assert human.returncode == 1
        assert "state:      failed" in human.stdout
        assert "simulated" in human.stdout
        as_json = _status_cli(sup.state_dir, "--json")
        assert as_json.returncode == 1
        assert json.loads(as_json.stdout)["held"]["identity"] == ia
        failed = _outcomes(sup, "failed")
        assert len(failed) == 1
        assert f"still holds the previous identity {ia}" in failed[0]["reason"]
        time.sleep(0.5)  # back-off: no retry storm
        assert len([r for r in sup.standin() if r["event"] == "start"]) == 2
        _flip_link(tmp_path / "serve", "a")  # back to what is held: nothing to load
        wait_for(ready_with(sup, ia), 30, "ready on a again", sup)
        assert _status_cli(sup.state_dir).returncode == 0
        assert sup.terminate() == 0
    finally:
        sup.cleanup()
    assert len([r for r in sup.standin() if r["event"] == "start"]) == 2


def test_the_new_daemon_takes_the_socket_path_over_while_the_old_one_serves(tmp_path):
    """Overlap on one socket path (here a fixed --socket-dir): the new daemon loads while the old one serves,
    waits for the path's lock, and takes it once the old one handed it over; the old one is then stopped."""
    a, b = tmp_path / "a", tmp_path / "b"
    ia, ib = make_checkpoint(a, seed=1), make_checkpoint(b, seed=2)
    os.symlink("a", tmp_path / "serve")
    sockets = tmp_path / "sockets"
    sup = SupervisorProc(
        tmp_path, [str(tmp_path / "serve")], extra_opts=["--socket-dir", str(sockets)]
    ).start()
    try:
        wait_for(ready_with(sup, ia), 30, "first", sup)
        _flip_link(tmp_path / "serve", "b")
        status = wait_for(ready_with(sup, ib), 30, "second", sup)
        assert status["mode"] == "overlap"
        assert status["socket_dir"] == str(sockets)
        assert status["held"]["sockets"] == [str(sockets / "vllm_weight_cache_standin.sock")]
        wait_for(lambda: _outcomes(sup, "stopped-old"), 30, "old daemon stopped", sup)
        assert sup.terminate() == 0
    finally:
        sup.cleanup()
    events = [(r["event"], r.get("identity")) for r in sup.standin()]
    # b started while a served; a let the path go before b took it (its handed-over report may come
    # later, as vLLM's does: after the lock is released); a stopped after b was ready
    assert events.index(("start", ib)) < events.index(("released", ia)) < events.index(("ready", ib))
    assert ("handed-over", ia) in events
    assert events.index(("ready", ib)) < events.index(("stop", ia))
    assert not [r for r in sup.standin() if r["event"] == "fail"]
    whys = [e["why"] for e in sup.decisions()]
    assert (
        whys.index("hand-over")
        < whys.index("ready", whys.index("weights-changed"))
        < whys.index("stopped-old")
    )


def _held_at(socket_path):
    """The identity the daemon now serving ``socket_path`` says it holds (``ckptpub_held``)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(str(socket_path))
        conn.sendall(daemon_reports.command_frame(daemon_reports.HELD_COMMAND))
        return read_message(conn)["key"]["checkpoint"]


def test_a_late_hand_over_report_does_not_make_the_new_daemon_give_the_path_up(tmp_path):
    """The old daemon reports ``handed-over`` only after it let the path go (as vLLM's loop does), here 1.5 s
    late: the new daemon takes the path and is ready first. The supervisor must not ask the path again,
    which by then the new daemon serves (a CI run once saw engines find no daemon for 300 s after a swap);
    and a hand-over that names another pid is refused by whichever daemon it reaches."""
    a, b = tmp_path / "a", tmp_path / "b"
    ia, ib = make_checkpoint(a, seed=1), make_checkpoint(b, seed=2)
    os.symlink("a", tmp_path / "serve")
    sockets = tmp_path / "sockets"
    path = sockets / "vllm_weight_cache_standin.sock"
    sup = SupervisorProc(
        tmp_path,
        [str(tmp_path / "serve")],
        env={"STANDIN_HANDED_OVER_DELAY_S": "1.5"},
        extra_opts=["--socket-dir", str(sockets)],
    ).start()
    try:
        old_pid = wait_for(ready_with(sup, ia), 30, "first", sup)["held"]["pid"]
        _flip_link(tmp_path / "serve", "b")
        new_pid = wait_for(ready_with(sup, ib), 30, "second", sup)["held"]["pid"]
        wait_for(lambda: _outcomes(sup, "stopped-old"), 30, "old daemon stopped", sup)
        assert _held_at(path) == ib
        assert send_command(str(path), daemon_reports.HAND_OVER_COMMAND, pid=old_pid)  # delivered
        assert _held_at(path) == ib
        assert sup.status()["held"]["pid"] == new_pid
        assert sup.terminate() == 0
    finally:
        sup.cleanup()
    events = [(r["event"], r.get("identity")) for r in sup.standin()]
    assert events.index(("ready", ib)) < events.index(("handed-over", ia))  # the late report
    assert ("handed-over", ib) not in events
    refused = [r["asked"] for r in sup.standin() if r["event"] == "hand-over-refused"]
    assert refused == [old_pid]  # only the test's own request; the supervisor sent none to the new daemon


def test_one_at_a_time(tmp_path):
    """--one-at-a-time: the old daemon is gone before the new one starts loading."""
    a, b = tmp_path / "a", tmp_path / "b"
    ia, ib = make_checkpoint(a, seed=1), make_checkpoint(b, seed=2)
    os.symlink("a", tmp_path / "serve")
    sup = SupervisorProc(tmp_path, [str(tmp_path / "serve")], extra_opts=["--one-at-a-time"]).start()
    try:
        wait_for(ready_with(sup, ia), 30, "first", sup)
        _flip_link(tmp_path / "serve", "b")
        wait_for(ready_with(sup, ib), 30, "second", sup)
        assert sup.status()["mode"] == "one-at-a-time"
        assert sup.terminate() == 0
    finally:
        sup.cleanup()
    events = [(r["event"], r.get("identity")) for r in sup.standin()]
    assert events.index(("stop", ia)) < events.index(("start", ib))
    assert not [r for r in sup.standin() if r["event"] == "fail"]
    whys = [e["why"] for e in sup.decisions()]
    assert whys.index("stopped-old") < whys.index("launched", whys.index("weights-changed"))


ENGINE_STANDIN = """
import pickle, socket, struct, sys, time
conn = socket.socket(socket.AF_UNIX)
conn.connect(sys.argv[1])
payload = pickle.dumps({"cmd": "get_state"})
conn.sendall(struct.pack("!Q", len(payload)) + payload)
conn.recv(1 << 16)
conn.close()
print("mapped", flush=True)
sys.stdin.read()  # holds the weights it mapped until the test closes its stdin
"""


def test_a_replaced_daemon_is_kept_while_an_engine_it_served_runs(tmp_path):
    """``zero_copy`` engines map the daemon's memory: a replaced daemon hands its path over at once but is
    stopped only after every engine process it handed weights to has exited (pids from SO_PEERCRED)."""
    a, b = tmp_path / "a", tmp_path / "b"
    ia, ib = make_checkpoint(a, seed=1), make_checkpoint(b, seed=2)
    os.symlink("a", tmp_path / "serve")
    sup = SupervisorProc(tmp_path, [str(tmp_path / "serve")]).start()
    engine = None
    try:
        status = wait_for(ready_with(sup, ia), 30, "first", sup)
        old_pid = status["held"]["pid"]
        (path,) = status["held"]["sockets"]
        engine = subprocess.Popen(
            [sys.executable, "-c", ENGINE_STANDIN, path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert engine.stdout.readline().strip() == "mapped"
        wait_for(lambda: sup.status()["held"]["engines"] == [engine.pid], 30, "engine recorded", sup)
        _flip_link(tmp_path / "serve", "b")
        status = wait_for(ready_with(sup, ib), 30, "second", sup)
        status = wait_for(lambda: (s := sup.status())["retired"] and s, 30, "old retired", sup)
        assert [(d["pid"], d["identity"], d["engines"]) for d in status["retired"]] == [
            (old_pid, ia, [engine.pid])
        ]
        human = _status_cli(sup.state_dir).stdout
        assert f"retired:    {ia} (pid {old_pid}), kept for engine pid(s) {engine.pid}" in human
        time.sleep(1)  # several polls: still kept
        assert pid_alive(old_pid)
        assert not _outcomes(sup, "stopped-old")
        kept = _outcomes(sup, "kept-for-engines")
        assert len(kept) == 1
        assert f"engine pid(s) {engine.pid} still map its weights" in kept[0]["reason"]
        engine.stdin.close()
        engine.wait(timeout=10)
        wait_for(lambda: sup.status()["retired"] == [], 30, "old stopped after the engine exited", sup)
        assert _outcomes(sup, "stopped-old")
        assert not pid_alive(old_pid)
        assert sup.terminate() == 0
    finally:
        if engine is not None and engine.poll() is None:
            engine.kill()
        sup.cleanup()


def test_sigterm_while_loading_and_cli_errors(tmp_path):
    m = tmp_path / "model"
    identity = make_checkpoint(m, seed=1)
    sup = SupervisorProc(tmp_path, [str(m)], env={"STANDIN_LOAD_S": "30"}).start()
    try:
        wait_for(lambda: [r for r in sup.standin() if r["event"] == "start"], 30, "loading", sup)
        assert sup.status()["state"] == "loading"
        pid = sup.standin()[0]["pid"]
        assert sup.terminate() == 0
        assert not pid_alive(pid)
        assert sup.status()["state"] == "stopped"
        assert not os.path.exists(sup.state_dir / "loading.json")
    finally:
        sup.cleanup()
    assert sup.standin()[-1]["event"] == "stop"
    assert sup.standin()[-1]["during"] == "load"

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "ckptpub", "preload", *map(str, args)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    (tmp_path / "bare").mkdir()
    for args in (
        [],
        [m, "--follow", tmp_path],
        [tmp_path / "missing"],
        [tmp_path / "bare"],
        ["--status", "--state-dir", tmp_path / "nothing"],
        ["--history", "--state-dir", tmp_path / "nothing"],
        ["--history", "--status"],
        [m, "--interval", "0"],
        [m, "--interval", "-1"],
        [m, "--interval", "nan"],  # busy-polled before the core's duration rule
        [m, "--interval", "inf"],  # ended as "internal error: OverflowError"
        [m, "--ready-timeout", "1e400"],
        [m, "--daemon-cmd", "echo hi"],
        [m, "--", "--weight-cache-socket-dir", "/x"],
        [m, "--daemon-cmd", "wrap {socket_dir} {folder}"],
        [m, "--ready-pattern", "("],
    ):
        result = cli(*args)
        assert result.returncode == 2, (args, result)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (args, result.stderr)
        assert lines[0].startswith("ckptpub preload: error:"), (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert identity


def test_second_supervisor_on_the_same_state_dir_is_refused(tmp_path):
    m = tmp_path / "model"
    identity = make_checkpoint(m, seed=1)
    sup = SupervisorProc(tmp_path, [str(m)]).start()
    try:
        wait_for(ready_with(sup, identity), 30, "ready", sup)
        other = SupervisorProc(tmp_path, [str(m)], state_dir=sup.state_dir)
        result = subprocess.run(other.argv, capture_output=True, text=True, env=other.env, timeout=60)
        assert result.returncode == 2
        assert "another supervisor" in result.stderr
        human = _status_cli(sup.state_dir)
        assert human.returncode == 0, human
        for text in (
            identity,
            str(m.resolve()),
            f"pid:      {sup.status()['held']['pid']}",
            "since:",
            "first-preload",
            "no daemon held",
        ):
            assert text in human.stdout, (text, human.stdout)
        history = subprocess.run(
            [sys.executable, "-m", "ckptpub", "preload", "--history", "--state-dir", str(sup.state_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert history.returncode == 0, history
        lines = history.stdout.splitlines()
        assert len(lines) == len(sup.decisions())  # one line per entry, oldest first
        assert "outcome  info [supervisor-start]" in lines[0]
        assert any(
            f"decision start [first-preload] no daemon held; preloading {identity[:19]}" in x for x in lines
        )
        as_json = subprocess.run(
            [
                sys.executable,
                "-m",
                "ckptpub",
                "preload",
                "--history",
                "--json",
                "--state-dir",
                str(sup.state_dir),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert [json.loads(x) for x in as_json.stdout.splitlines()] == sup.decisions()
        data = json.loads(_status_cli(sup.state_dir, "--json").stdout)
        assert data["supervisor_alive"]
        assert data["held"]["identity"] == identity
        assert data["socket_dir"]
        assert data["last_decision"]["why"] == "first-preload"
        assert sup.terminate() == 0
        assert _status_cli(sup.state_dir).returncode == 1  # stopped: nothing held
    finally:
        sup.cleanup()


#: Run-index lines a hostile or broken writer could leave; each must be skipped with a warning, never fatal.
HOSTILE_INDEX_LINES = [
    '{"step": 1e999, "path": "checkpoint-10", "identity": "IDENTITY"}',
    '{"step": 1e400, "path": "checkpoint-10", "identity": "IDENTITY"}',
    '{"step": "99", "path": "checkpoint-10", "identity": "IDENTITY"}',
    '{"step": true, "path": "checkpoint-10", "identity": "IDENTITY"}',
    '{"step": -5, "path": "checkpoint-10", "identity": "IDENTITY"}',
    '{"step": 99.5, "path": "checkpoint-10", "identity": "IDENTITY"}',
    '{"step": 99, "path": "../../etc", "identity": "IDENTITY"}',
    '{"step": 99, "path": 7, "identity": "IDENTITY"}',
    '{"step": 99, "path": "checkpoint-10", "identity": "md5:00"}',
    '{"step": 99, "path": "checkpoint-10\\udc80", "identity": "IDENTITY"}',
    "[1, 2, 3]",
    "[" * 5000 + "]" * 5000,
]


def test_hostile_run_index_lines_are_skipped_and_a_fatal_error_stops_the_daemon(tmp_path):
    from support.preload_helpers import Run

    run = Run(tmp_path / "run")
    identity = make_checkpoint(run.root / "checkpoint-10", seed=3)
    run.append(10, "checkpoint-10", identity)
    with open(run.root / "ckptpub-index.jsonl", "a") as handle:
        for line in HOSTILE_INDEX_LINES:
            handle.write(line.replace("IDENTITY", identity) + "\n")
    sup = SupervisorProc(tmp_path, ["--follow", str(run.root)]).start()
    try:
        wait_for(ready_with(sup, identity), 30, "ready with the one good record", sup)
        warnings = [e["reason"] for e in _outcomes(sup, "warning") if "run index line" in e["reason"]]
        assert len(warnings) == len(HOSTILE_INDEX_LINES), warnings
        pid = sup.status()["held"]["pid"]
        assert pid_alive(pid)
        # A fatal error in the supervisor (its status file cannot be written any more) must stop the daemon.
        status = sup.state_dir / "status.json"
        status.unlink()
        status.mkdir()
        (status / "blocker").write_text("x")
        assert sup.proc.wait(timeout=30) == 2
        assert not pid_alive(pid), "the supervisor exited and left its daemon running"
        lines = sup.stderr().strip().splitlines()
        assert lines[-1].startswith("ckptpub preload: error:"), lines[-3:]
        assert "Traceback" not in sup.stderr()
        assert "supervisor stopping on an error" in " ".join(
            e["reason"] for e in _outcomes(sup, "supervisor-stop")
        )
    finally:
        sup.cleanup()


def test_follow_on_an_adapter_run_preloads_the_base_its_adapters_record(tmp_path):
    """A LoRA run's steps are adapters: the daemon is launched on the base their manifests record (found
    through adapter_config.json, checked against the base's own manifest), never on an adapter folder."""
    from support.preload_helpers import Run, make_adapter

    base = tmp_path / "base"
    base_identity = make_checkpoint(base, seed=7)
    run = Run(tmp_path / "lora-run")
    for step in (10, 20):
        identity = make_adapter(run.root / f"checkpoint-{step}", base, base_identity, seed=step)
        run.append(step, f"checkpoint-{step}", identity)
    sup = SupervisorProc(tmp_path, ["--follow", str(run.root)]).start()
    try:
        status = wait_for(ready_with(sup, base_identity), 30, "the base held", sup)
        assert status["held"]["folder"] == str(base.resolve())
        assert status["target"]["step"] == 20
        assert any(f"step 20 is an adapter on base {base_identity}" in n for n in status["target"]["notes"])
        identity = make_adapter(run.root / "checkpoint-30", base, base_identity, seed=30)
        run.append(30, "checkpoint-30", identity)
        wait_for(lambda: sup.status()["target"].get("step") == 30, 30, "step 30 observed", sup)
        assert sup.status()["held"]["pid"] == status["held"]["pid"]  # a new adapter: the same base, kept
        assert sup.terminate() == 0
    finally:
        sup.cleanup()
    assert [r["folder"] for r in sup.standin() if r["event"] == "start"] == [str(base.resolve())]


def test_an_adapter_run_whose_base_is_in_the_run_index(tmp_path):
    from support.preload_helpers import Run, make_adapter

    run = Run(tmp_path / "lora-run")
    base_identity = make_checkpoint(run.root / "base", seed=7)
    run.append(0, "base", base_identity)  # a base published into the run (adapter_config names a hub id)
    run.append(10, "checkpoint-10", make_adapter(run.root / "checkpoint-10", None, base_identity))
    sup = SupervisorProc(tmp_path, ["--follow", str(run.root)]).start()
    try:
        status = wait_for(ready_with(sup, base_identity), 30, "the base held", sup)
        assert status["held"]["folder"] == str((run.root / "base").resolve())
        assert sup.terminate() == 0
    finally:
        sup.cleanup()


def test_an_adapter_run_whose_base_cannot_be_found_stops_naming_the_identity(tmp_path):
    from support.preload_helpers import Run, make_adapter

    run = Run(tmp_path / "lora-run")
    missing = tmp_path / "moved-away-base"
    base_identity = "blake3:" + "7" * 64
    run.append(10, "checkpoint-10", make_adapter(run.root / "checkpoint-10", missing, base_identity))
    sup = SupervisorProc(tmp_path, ["--follow", str(run.root)])
    done = subprocess.run(sup.argv, capture_output=True, text=True, env=sup.env, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, lines
    assert lines[-1].startswith("ckptpub preload: error: "), lines
    assert (
        f"its adapters apply on base {base_identity}, and no folder with that identity was found" in lines[-1]
    )
    assert "preload that base with `ckptpub preload BASE_DIR`" in lines[-1]
    assert "Traceback" not in done.stderr
    assert not [
        r for r in sup.standin() if r["event"] == "start"
    ]  # no daemon, on an adapter or anything else


def test_a_malformed_step_is_skipped_and_the_held_daemon_kept(tmp_path):
    """A published step whose model region is unsorted, its identity recomputed to match, is skipped (its
    manifest is refused on reading, every rule of its entries checked: issue 26, item 13) and named with
    the rule in the status's notes; the daemon held keeps serving, and the next usable step is preloaded
    (issue 26, item 3: it used to make the change description raise and the supervisor exit)."""
    from support.checkpoints import forged_regions, swap_first_entries, v3_parts
    from support.preload_helpers import Run

    run = Run(tmp_path / "run")
    i10 = make_checkpoint(run.root / "checkpoint-10", seed=1)
    run.append(10, "checkpoint-10", i10)
    sup = SupervisorProc(tmp_path, ["--follow", str(run.root)]).start()
    try:
        pid = wait_for(ready_with(sup, i10), 30, "step 10 held", sup)["held"]["pid"]
        step20 = run.root / "checkpoint-20"
        make_checkpoint(step20, seed=2)
        forged = forged_regions(
            (step20 / "ckptpub.json").read_bytes(),
            lambda model, layout: (swap_first_entries(model), layout),
        )
        (step20 / "forged.tmp").write_bytes(forged)
        os.replace(step20 / "forged.tmp", step20 / "ckptpub.json")
        run.append(20, "checkpoint-20", v3_parts(forged)[0]["identity"])

        def noted():
            notes = (sup.status().get("target") or {}).get("notes", [])
            why = "ckptpub.json: model region: names are not sorted"
            return [note for note in notes if note.startswith("skipped step 20: ") and why in note]

        wait_for(noted, 30, "step 20 skipped in the status's notes", sup)
        time.sleep(1)  # many polls: the same daemon, still supervising
        status = sup.status()
        assert (status["state"], status["held"]["pid"], status["held"]["identity"]) == ("ready", pid, i10)
        assert sup.proc.poll() is None
        i30 = make_checkpoint(run.root / "checkpoint-30", seed=3)
        run.append(30, "checkpoint-30", i30)
        wait_for(ready_with(sup, i30), 30, "step 30 preloaded", sup)
        assert sup.terminate() == 0
    finally:
        sup.cleanup()


def test_a_folder_named_with_a_terminal_escape_and_a_newline_never_reaches_the_terminal_raw(tmp_path):
    """Every line ``ckptpub preload`` prints about such a folder (its start, ``--status``, ``--history``, a
    refusal at start and while supervising) is ``one_line``'s: no control character but the line ends."""
    model = tmp_path / "m\x1b[2J\nx"
    identity = make_checkpoint(model, seed=1)
    printed = []
    bare = tmp_path / "bare\x1b[2J\nfolder"
    bare.mkdir()
    refused = subprocess.run(
        [sys.executable, "-m", "ckptpub", "preload", str(bare)], capture_output=True, timeout=60
    )
    assert refused.returncode == 2, refused
    printed.append(refused.stdout + refused.stderr)
    sup = SupervisorProc(tmp_path, [str(model)]).start()
    try:
        wait_for(ready_with(sup, identity), 30, "ready", sup)
        (model / "ckptpub.json").write_bytes(b"{not json\n")  # refused while supervising: target unusable
        wait_for(lambda: (sup.status().get("target") or {}).get("error"), 30, "target unusable", sup)
        for extra in ([], ["--history"]):
            shown = subprocess.run(
                [sys.executable, "-m", "ckptpub", "preload", "--state-dir", str(sup.state_dir)]
                + (extra or ["--status"]),
                capture_output=True,
                timeout=60,
            )
            printed.append(shown.stdout + shown.stderr)
        assert sup.terminate() == 0
    finally:
        sup.cleanup()
    printed.append(sup.stderr_path.read_bytes())
    for output in printed:
        assert not {byte for byte in output if byte < 0x20 and byte != 0x0A} | ({0x7F} & set(output)), output
    assert all(b"\\x1b[2J\\n" in output for output in printed), printed  # named, escaped
