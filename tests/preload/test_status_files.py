"""The supervisor's state: its files written like the manifest and the run index (ckptpub.jsonfiles)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from ckptpub_vllm.preload import status as st
from ckptpub_vllm.preload.supervisor import Config, State, Supervisor

from ckptpub.errors import CkptpubError


def test_a_status_write_that_fails_leaves_no_temporary_file(tmp_path: Path) -> None:
    """Before the one writer, a failed rename left ``status.json.tmp.PID`` behind for good."""
    (tmp_path / st.STATUS).mkdir()
    (tmp_path / st.STATUS / "blocker").write_text("x")
    with pytest.raises(CkptpubError, match=f"^{st.STATUS}: cannot write in "):
        st.write_json(str(tmp_path / st.STATUS), {"state": "ready"})
    assert os.listdir(tmp_path) == [st.STATUS]


def test_status_records_read_back_and_unusable_ones_read_as_none(tmp_path: Path) -> None:
    path = str(tmp_path / st.DAEMON)
    assert st.read_json(path) is None  # missing
    st.write_json(path, {"pid": 7, "identity": "blake3:" + "0" * 64})
    assert st.read_json(path) == {"pid": 7, "identity": "blake3:" + "0" * 64}
    (tmp_path / st.DAEMON).write_text('{"pid": 7, "pid": 8}')  # strict: a duplicate key is not a record
    assert st.read_json(path) is None
    os.unlink(path)
    os.symlink(tmp_path / "elsewhere.json", path)
    (tmp_path / "elsewhere.json").write_text('{"pid": 9}')
    assert st.read_json(path) is None  # a link planted at the name is not followed


def test_the_decision_log_survives_a_torn_line(tmp_path: Path) -> None:
    """A supervisor killed mid-append leaves a torn line: the next entry is whole, readers skip it."""
    st.append_decision(str(tmp_path), {"event": "decision", "action": "start"})
    with open(tmp_path / st.DECISIONS, "ab") as handle:
        handle.write(b'{"event": "outcome", "act')
    st.append_decision(str(tmp_path), {"event": "outcome", "action": "ready"})
    assert [e["action"] for e in st.read_decisions(str(tmp_path))] == ["start", "ready"]


def test_the_decision_log_is_not_written_through_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched\n")
    state = tmp_path / "state"
    state.mkdir()
    os.symlink(outside, state / st.DECISIONS)
    with pytest.raises(CkptpubError, match=f"^{st.DECISIONS}: "):
        st.append_decision(str(state), {"event": "decision"})
    assert outside.read_text() == "untouched\n"


def test_supervisor_states_are_the_documented_ones_and_none_follows_stopped(tmp_path: Path) -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "preload.md").read_text()
    listed = re.search(r"\| `status.json` \| `state` \(([^)]*)\)", docs)
    assert listed is not None
    assert re.findall(r"`([a-z-]+)`", listed.group(1)) == [state.value for state in State]
    supervisor = Supervisor(Config(model_dir=str(tmp_path), state_dir=str(tmp_path / "state")))
    assert supervisor.state is State.STARTING
    supervisor._move_to(State.STOPPED)
    with pytest.raises(RuntimeError, match="supervisor state ready after stopped"):
        supervisor._move_to(State.READY)
