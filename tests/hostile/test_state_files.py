"""The supervisor's state folder, planted or corrupt: one line naming the file, no write elsewhere, no hang.

Every case is a real ``ckptpub preload`` process (the supervisor with the stand-in daemon of
``tests/preload``, or ``--status``/``--history``) under a timeout, so a FIFO blocked on fails
the test instead of hanging it.

* **Planted at a name** (``PLANTED``): ``supervisor.lock``, ``logs``, ``logs/daemon-1.log``,
  ``decisions.jsonl`` as a symlink to a file or folder outside, a FIFO, a folder, a regular
  file where a folder belongs; and the state folder itself as a file, writable by every user,
  or another user's. The supervisor refuses with exit 2 and a last line naming the file
  (``shared.own_files``'s one rule), writes nothing outside and starts no daemon it cannot log.
* **--status and --history** with the lock planted: one line naming it, at once.
* **Corrupt values** (``BAD_STATUS``, ``BAD_ENTRIES``): ``status.json`` of another shape is refused
  in one line naming the field; each decision-log line of another shape is skipped with one
  line saying why (``preload.schema``), the others printed; never "internal error".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.preload_helpers import SupervisorProc, make_checkpoint

IDENTITY = "blake3:" + "ab" * 32
OUTSIDE_TEXT = "outside: never written\n"


def _outside(tmp: Path) -> Path:
    outside = tmp / "outside.txt"
    outside.write_text(OUTSIDE_TEXT)
    return outside


def _symlink_out(name: str) -> Callable[[Path, Path], str]:
    def plant(state: Path, tmp: Path) -> str:
        (state / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(_outside(tmp), state / name)
        return name

    return plant


def _fifo(name: str) -> Callable[[Path, Path], str]:
    def plant(state: Path, tmp: Path) -> str:
        (state / name).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(state / name)
        return name

    return plant


def _folder(name: str) -> Callable[[Path, Path], str]:
    def plant(state: Path, tmp: Path) -> str:
        (state / name).mkdir(parents=True)
        return name

    return plant


def _logs_a_file(state: Path, tmp: Path) -> str:
    (state / "logs").write_text("not a folder\n")
    return "logs: a regular file, not a folder"


def _logs_a_link(state: Path, tmp: Path) -> str:
    outside = tmp / "outside-logs"
    outside.mkdir()
    os.symlink(outside, state / "logs")
    return "logs: a symlink"


def _mode(mode: int) -> Callable[[Path, Path], str]:
    def plant(state: Path, tmp: Path) -> str:
        state.chmod(mode)
        return "every user may write this folder"

    return plant


def _another_users(mode: int) -> Callable[[Path, Path], str]:
    def plant(state: Path, tmp: Path) -> str:
        if os.geteuid() != 0:
            pytest.skip("needs root to give the state folder to another user")
        os.chown(state, 65534, 65534)
        state.chmod(mode)
        return "every user may write" if mode & 0o002 else "belongs to another user"

    return plant


def _state_a_file(state: Path, tmp: Path) -> str:
    state.rmdir()
    state.write_text("not a folder\n")
    return "state: a regular file, not a folder"


#: What is planted in a fresh state folder -> the text the supervisor's one error line must hold.
PLANTED: dict[str, Callable[[Path, Path], str]] = {
    "lock a symlink to a file outside": _symlink_out("supervisor.lock"),
    "lock a FIFO": _fifo("supervisor.lock"),
    "lock a folder": _folder("supervisor.lock"),
    "logs a regular file": _logs_a_file,
    "logs a symlink to a folder outside": _logs_a_link,
    "daemon log a symlink to a file outside": _symlink_out("logs/daemon-1.log"),
    "daemon log a FIFO": _fifo("logs/daemon-1.log"),
    "daemon log a folder": _folder("logs/daemon-1.log"),
    "decision log a symlink to a file outside": _symlink_out("decisions.jsonl"),
    "decision log a FIFO": _fifo("decisions.jsonl"),
    "state folder writable by every user": _mode(0o777),
    "state folder writable by every user, sticky": _mode(0o1777),
    "state folder another user's, writable by every user": _another_users(0o777),
    "state folder another user's": _another_users(0o755),
    "state folder a regular file": _state_a_file,
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("model") / "model"
    make_checkpoint(folder, seed=1)
    return folder


@pytest.mark.parametrize("case", PLANTED)
def test_the_supervisor_refuses_a_planted_state_file_in_one_line(
    case: str, model: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    expected = PLANTED[case](state, tmp_path)
    sup = SupervisorProc(tmp_path, [str(model)], state_dir=state)
    try:
        started = time.monotonic()
        result = subprocess.run(sup.argv, env=sup.env, capture_output=True, text=True, timeout=60)
        assert time.monotonic() - started < 30, "a planted file made the supervisor wait"
    finally:
        sup.cleanup()
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ckptpub preload: error: "), result.stderr
    assert expected in last, (expected, last)
    assert "Traceback" not in result.stderr
    assert "internal error" not in result.stderr
    assert "cannot start the daemon command" not in result.stderr  # the state, not the command, is at fault
    outside = tmp_path / "outside.txt"
    assert not outside.exists() or outside.read_text() == OUTSIDE_TEXT
    assert not (tmp_path / "outside-logs").exists() or not os.listdir(tmp_path / "outside-logs")
    assert not sup.record.exists(), "a daemon was started although its log could not be opened"


def _preload(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckptpub", "preload", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _status_of(**changes: object) -> dict[str, object]:
    """A ``status.json`` as a supervisor writes it, with ``changes``."""
    now = time.time()
    held = {
        "identity": IDENTITY,
        "folder": "/models/m",
        "pid": 4242,
        "since": now,
        "socket_dir": None,
        "sockets": ["/tmp/vllm_weight_cache_0/x.sock"],
        "engines": [4343],
        "generation": 1,
        "log": "/state/logs/daemon-1.log",
        "alive": True,
    }
    entry = {"time": now, "event": "decision", "action": "start", "why": "first-preload", "reason": "r"}
    status = {
        "state": "ready",
        "supervisor_pid": 4141,
        "updated": now,
        "generation": 1,
        "mode": "overlap",
        "follow": None,
        "model_dir": "/models/m",
        "daemon_cmd": "vllm preload",
        "target": {"folder": "/models/m", "identity": IDENTITY, "step": 3},
        "held": held,
        "loading": None,
        "retired": [dict(held, pid=4040)],
        "socket_dir": None,
        "last_decision": entry,
        "last_error": None,
    }
    for path, value in changes.items():
        *parents, name = path.split(".")
        where: dict = status
        for parent in parents:
            where = where[parent]
        where[name] = value
    return status


#: ``status.json`` fields a supervisor never writes -> the field the refusal names.
BAD_STATUS: dict[str, tuple[dict[str, object], str]] = {
    "updated a string": ({"updated": "yesterday"}, "updated"),
    "updated 1e300": ({"updated": 1e300}, "updated"),
    "updated -1e300": ({"updated": -1e300}, "updated"),
    "updated 1e17": ({"updated": 1e17}, "updated"),
    "updated true": ({"updated": True}, "updated"),
    "held a list": ({"held": [IDENTITY]}, "held"),
    "held.sockets numbers": ({"held.sockets": [1, 2]}, "held.sockets[0]"),
    "held.since 1e300": ({"held.since": 1e300}, "held.since"),
    "held.engines strings": ({"held.engines": ["4343"]}, "held.engines[0]"),
    "held.alive a string": ({"held.alive": "no"}, "held.alive"),
    "held.pid a float": ({"held.pid": 1.5}, "held.pid"),
    "retired an object": ({"retired": {"pid": 1}}, "retired"),
    "retired holding a string": ({"retired": ["x"]}, "retired[0]"),
    "loading a string": ({"loading": "yes"}, "loading"),
    "target a list": ({"target": []}, "target"),
    "target.step a string": ({"target.step": "3"}, "target.step"),
    "last_decision a string": ({"last_decision": "start"}, "last_decision"),
    "last_decision.time 1e17": ({"last_decision.time": 1e17}, "last_decision.time"),
    "last_error a number": ({"last_error": 7}, "last_error"),
    "supervisor_pid a string": ({"supervisor_pid": "4141"}, "supervisor_pid"),
    "generation a float": ({"generation": 1e300}, "generation"),
}


@pytest.mark.parametrize("case", BAD_STATUS)
def test_status_of_another_shape_is_refused_in_one_line_naming_the_field(case: str, tmp_path: Path) -> None:
    changes, field = BAD_STATUS[case]
    (tmp_path / "status.json").write_text(json.dumps(_status_of(**changes)))
    for extra in ([], ["--json"]):
        result = _preload("--status", "--state-dir", tmp_path, *extra)
        assert result.returncode == 2, result
        assert result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith(
            f"ckptpub preload: error: {tmp_path / 'status.json'}: not what a supervisor"
        )
        assert f"({field}: " in lines[0], lines[0]


def test_status_not_an_object_or_not_json_is_refused_in_one_line(tmp_path: Path) -> None:
    for text in ("[1, 2]", "null", '"ready"', '{"state": "ready", "state": "failed"}', '{"updated": NaN}'):
        (tmp_path / "status.json").write_text(text)
        result = _preload("--status", "--state-dir", tmp_path)
        assert result.returncode == 2, (text, result)
        assert len(result.stderr.strip().splitlines()) == 1, (text, result.stderr)
        assert "status.json" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_a_status_as_a_supervisor_writes_it_is_shown(tmp_path: Path) -> None:
    (tmp_path / "status.json").write_text(json.dumps(_status_of()))
    result = _preload("--status", "--state-dir", tmp_path)
    assert result.returncode == 1, result  # no supervisor holds the lock: possibly stale
    assert IDENTITY in result.stdout, result.stdout
    assert "stale" in result.stdout, result.stdout
    assert result.stderr == ""


#: Decision-log lines a supervisor never writes -> what the skip line says.
BAD_ENTRIES = [
    ('{"time": 1e300, "event": "decision", "action": "start"}', "time: 1e+300 is not a time"),
    ('{"time": -1e300, "event": "decision", "action": "start"}', "time: -1e+300 is not a time"),
    ('{"time": 1e17, "event": "decision", "action": "start"}', "time: 1e+17 is not a time"),
    ('{"time": "now", "event": "decision"}', "time: 'now' is not a time"),
    ('{"time": 1.0, "event": 5}', "event: 5 is not a string"),
    ('{"time": 1.0, "reason": ["x"]}', "reason: a list is not a string"),
    ('{"time": 1.0, "held": []}', "held: a list is not an object"),
    ('{"time": 1.0, "held": {"since": 1e300}}', "held.since: 1e+300 is not a time"),
    ('{"time": 1.0, "target": "x"}', "target: 'x' is not an object"),
    ('{"time": 1.0, "daemon": {"pid": "1"}}', "daemon.pid: '1' is not an integer"),
    ("[1, 2]", "a list is not an object"),
    ("null", "None is not an object"),
    ('{"time": 1e400}', "line"),  # not JSON as ckptpub reads it
    ('{"time": 1.0, "ev', "line"),  # torn
]


def test_history_skips_each_line_of_another_shape_in_one_line(tmp_path: Path) -> None:
    good = {
        "time": 1764412346.1,
        "event": "decision",
        "action": "start",
        "why": "first-preload",
        "reason": "ok",
    }
    lines = [json.dumps(good)] + [line for line, _ in BAD_ENTRIES] + [json.dumps(dict(good, reason="last"))]
    (tmp_path / "decisions.jsonl").write_text("\n".join(lines) + "\n")
    for extra in ([], ["--json"]):
        result = _preload("--history", "--state-dir", tmp_path, *extra)
        assert result.returncode == 0, result
        assert "Traceback" not in result.stderr
        assert "internal error" not in result.stderr
        printed = result.stdout.splitlines()
        assert len(printed) == 2, printed
        assert printed[-1].endswith("last") or json.loads(printed[-1])["reason"] == "last"
        skipped = result.stderr.strip().splitlines()
        assert len(skipped) == len(BAD_ENTRIES), result.stderr
        for number, ((_, why), line) in enumerate(zip(BAD_ENTRIES, skipped, strict=True), 2):
            assert line.startswith(f"ckptpub preload: decisions.jsonl line {number} skipped: "), line
            assert why in line, (why, line)


@pytest.mark.parametrize("case", ["lock a symlink to a file outside", "lock a FIFO", "lock a folder"])
def test_status_with_a_planted_lock_ends_at_once_naming_it(case: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "status.json").write_text(json.dumps(_status_of()))
    PLANTED[case](state, tmp_path)
    started = time.monotonic()
    result = _preload("--status", "--state-dir", state)
    assert time.monotonic() - started < 30
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"{state / 'supervisor.lock'}: " in lines[0], result.stderr


@pytest.mark.parametrize("case", ["state folder writable by every user", "state folder another user's"])
def test_status_and_history_refuse_a_state_folder_others_may_change(case: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "status.json").write_text(json.dumps(_status_of()))
    (state / "decisions.jsonl").write_text("")
    expected = PLANTED[case](state, tmp_path)
    for flag in ("--status", "--history"):
        result = _preload(flag, "--state-dir", state)
        assert result.returncode == 2, result
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert f"{state}: " in lines[0], lines[0]
        assert expected in lines[0], lines[0]


@pytest.mark.parametrize(
    ("name", "planted"),
    [
        ("status.json", "symlink"),
        ("status.json", "FIFO"),
        ("decisions.jsonl", "symlink"),
        ("decisions.jsonl", "FIFO"),
    ],
)
def test_status_and_history_with_a_planted_document_end_at_once_naming_it(
    name: str, planted: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "status.json").write_text(json.dumps(_status_of()))
    (state / "decisions.jsonl").write_text("")
    (state / name).unlink()
    plant = _symlink_out(name) if planted == "symlink" else _fifo(name)
    plant(state, tmp_path)
    flag = "--status" if name == "status.json" else "--history"
    started = time.monotonic()
    result = _preload(flag, "--state-dir", state)
    assert time.monotonic() - started < 30
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert name in lines[0], lines[0]


#: Records a supervisor never writes, left where the next one adopts from; it must start afresh.
BAD_RECORDS = {
    "daemon.json generation a string": ("daemon.json", {"pid": 1, "generation": "x"}),
    "daemon.json since 1e300": ("daemon.json", {"pid": 1, "identity": IDENTITY, "since": 1e300}),
    "daemon.json a list": ("daemon.json", [1, 2]),
    "loading.json generation a float": ("loading.json", {"pid": 1, "generation": 1e300}),
    "loading.json ready_at a string": ("loading.json", {"pid": 1, "ready_at": "soon"}),
    "retired.json an object": ("retired.json", {"pid": 1}),
    "retired.json argv numbers": ("retired.json", [{"pid": 1, "argv": [1, 2]}]),
    "status.json generation a string": ("status.json", {"generation": "x"}),
    "status.json a list": ("status.json", [1]),
}


@pytest.mark.parametrize("case", BAD_RECORDS)
def test_a_supervisor_starts_afresh_over_records_of_another_shape(
    case: str, model: Path, tmp_path: Path
) -> None:
    from support.preload_helpers import ready_with, wait_for

    import ckptpub

    name, value = BAD_RECORDS[case]
    state = tmp_path / "state"
    state.mkdir()
    (state / name).write_text(json.dumps(value))
    sup = SupervisorProc(tmp_path, [str(model)], state_dir=state).start()
    try:
        wait_for(ready_with(sup, ckptpub.read_manifest(model).identity), 30, "ready", sup)
        assert sup.terminate() == 0
    finally:
        sup.cleanup()
    assert "Traceback" not in sup.stderr()


def test_a_daemon_log_swapped_for_a_symlink_while_loading_stops_the_supervisor_naming_it(
    model: Path, tmp_path: Path
) -> None:
    """The log is read back by name on every poll: a symlink put there after the daemon started is not
    followed; the daemon cannot be confirmed, so it is stopped and the supervisor ends naming the log."""
    from support.preload_helpers import pid_alive, wait_for

    state = tmp_path / "state"
    sup = SupervisorProc(tmp_path, [str(model)], state_dir=state, env={"STANDIN_LOAD_S": "30"}).start()
    try:
        started = wait_for(lambda: [r for r in sup.standin() if r["event"] == "start"], 30, "loading", sup)
        log = state / "logs" / "daemon-1.log"
        os.unlink(log)
        os.symlink(_outside(tmp_path), log)
        assert sup.proc is not None
        assert sup.proc.wait(timeout=60) == 2
        assert not pid_alive(started[0]["pid"]), "the daemon was left running"
    finally:
        sup.cleanup()
    last = sup.stderr().strip().splitlines()[-1]
    assert last.startswith("ckptpub preload: error: "), last
    assert f"{state / 'logs' / 'daemon-1.log'}: is a symlink" in last, last
    assert (tmp_path / "outside.txt").read_text() == OUTSIDE_TEXT
