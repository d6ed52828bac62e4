"""The one writer of shared JSON files: whole documents or nothing, whole log lines, no link followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptpub._filesystem import jsonfiles
from ckptpub.errors import CkptpubError


def test_a_document_replaces_whatever_link_is_at_its_name_and_writes_nothing_through_it(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text("untouched")
    folder = tmp_path / "state"
    folder.mkdir()
    os.symlink(outside, folder / "status.json")
    jsonfiles.write_json(str(folder / "status.json"), {"state": "ready", "n": [1, 2]}, mode=0o600)
    target = folder / "status.json"
    assert target.is_file()
    assert not target.is_symlink()
    assert jsonfiles.read_json(str(target), 1000, "status.json") == {"state": "ready", "n": [1, 2]}
    assert target.stat().st_mode & 0o777 == 0o600
    assert outside.read_text() == "untouched"
    assert sorted(os.listdir(folder)) == ["status.json"]  # no temporary file left


def test_a_failed_replace_leaves_no_temporary_file_and_names_the_file(tmp_path: Path) -> None:
    """The rename fails for real: a non-empty folder sits at the document's name."""
    blocker = tmp_path / "status.json"
    blocker.mkdir()
    (blocker / "keep").write_text("x")
    with pytest.raises(CkptpubError, match=rf"^status.json: cannot write in {tmp_path}: "):
        jsonfiles.write_json(str(blocker), {"state": "ready"})
    assert sorted(os.listdir(tmp_path)) == ["status.json"]
    assert (blocker / "keep").read_text() == "x"


def test_a_document_in_a_missing_folder_is_refused_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(
        CkptpubError, match=r"^ckptpub.json: cannot write in .*/gone: No such file or directory$"
    ):
        jsonfiles.write_atomically(str(tmp_path / "gone" / "ckptpub.json"), b"{}")
    assert os.listdir(tmp_path) == []


def test_an_append_after_a_torn_line_stays_whole_and_the_torn_line_is_skipped(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    jsonfiles.append_line(str(log), {"n": 1}, log.name)
    with open(log, "ab") as handle:
        handle.write(b'{"n": 2, "reas')  # a writer that crashed mid-line
    jsonfiles.append_line(str(log), {"n": 3}, log.name)
    skipped: list[tuple[int, str]] = []
    lines = jsonfiles.read_lines(str(log), 1000, log.name, lambda number, why: skipped.append((number, why)))
    assert lines == [(1, {"n": 1}), (3, {"n": 3})]
    assert [number for number, _ in skipped] == [2]
    assert "line 2: record is not valid JSON" in skipped[0][1]
    assert log.read_bytes().endswith(b'{"n":3}\n')


@pytest.mark.parametrize("kind", ["symlink out", "folder", "FIFO"])
def test_an_append_refuses_what_is_not_a_plain_log(tmp_path: Path, kind: str) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_text("untouched\n")
    log = tmp_path / "decisions.jsonl"
    if kind == "symlink out":
        os.symlink(outside, log)
    elif kind == "folder":
        log.mkdir()
    else:
        os.mkfifo(log)
    with pytest.raises(CkptpubError, match=r"^decisions.jsonl: "):
        jsonfiles.append_line(str(log), {"n": 1}, log.name)
    assert outside.read_text() == "untouched\n"


def test_reading_a_log_is_bounded_and_a_missing_log_is_empty(tmp_path: Path) -> None:
    log = tmp_path / "index.jsonl"
    assert jsonfiles.read_lines(str(log), 10, log.name) == []
    log.write_text('{"n": 1}\n' * 5)
    with pytest.raises(CkptpubError, match="index.jsonl: 45 bytes is over the 44-byte limit"):
        jsonfiles.read_lines(str(log), 44, log.name)


def test_lines_a_check_refuses_are_skipped_in_line_order_with_undecodable_ones(tmp_path: Path) -> None:
    log = tmp_path / "index.jsonl"
    log.write_text('{"n": 1}\n{"n": "2"}\nnot json\n{"n": 4}\n')
    skipped: list[tuple[int, str]] = []

    def check(value: object) -> str | None:
        return None if isinstance(value, dict) and type(value.get("n")) is int else "n is not an integer"

    lines = jsonfiles.read_lines(
        str(log), 1000, log.name, lambda number, why: skipped.append((number, why)), check=check
    )
    assert lines == [(1, {"n": 1}), (4, {"n": 4})]
    assert [number for number, _ in skipped] == [2, 3]
    assert skipped[0][1] == "n is not an integer"
