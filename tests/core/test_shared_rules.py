"""Rules the core implements once, for itself, the vLLM plugin and ``ckptpub preload`` (``integration``).

Flags and durations as people write them, every ``CKPTPUB_*`` variable listed in one
place, and small files read without following a symlink out of the folder, blocking on
a FIFO or trusting a size.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from ckptpub import CkptpubError
from ckptpub.integration import (
    VARIABLES,
    OpenError,
    env_flag,
    flag,
    open_inside,
    read_bounded,
    read_inside,
    resolve_inside,
    seconds,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", True), ("true", True), (" Yes ", True), ("ON", True), ("0", False), ("False", False)]
    + [("no", False), ("off", False), ("", False), ("  ", False)],
)
def test_a_flag_reads_one_way(text: str, value: bool) -> None:
    assert flag(text, "CKPTPUB_X") is value


@pytest.mark.parametrize("text", ["maybe", "2", "enabled", "y", "nope", "1.0"])
def test_a_flag_that_is_neither_on_nor_off_is_refused(text: str) -> None:
    with pytest.raises(CkptpubError, match=f"^CKPTPUB_X: {re.escape(repr(text))} is neither on"):
        flag(text, "CKPTPUB_X")


def test_an_unset_variable_is_off() -> None:
    assert env_flag("CKPTPUB_REQUIRE_MANIFEST", {}) is False
    assert env_flag("CKPTPUB_REQUIRE_MANIFEST", {"CKPTPUB_REQUIRE_MANIFEST": "on"}) is True


@pytest.mark.parametrize(("value", "number"), [("2.5", 2.5), (5, 5.0), (" 1e3 ", 1000.0), (0.001, 0.001)])
def test_a_duration_is_a_positive_finite_number_of_seconds(value: object, number: float) -> None:
    assert seconds(value, "--interval") == number


@pytest.mark.parametrize(
    "value", ["nan", "inf", "-inf", float("nan"), float("inf"), 0, -1, "1e400", "abc", True, None, 1e8]
)
def test_a_duration_that_would_spin_or_overflow_is_refused(value: object) -> None:
    with pytest.raises(CkptpubError, match=r"^--interval: .* is not a positive number of seconds"):
        seconds(value, "--interval")


def test_every_ckptpub_variable_is_listed() -> None:
    """Each ``CKPTPUB_*`` name the runtime code mentions (core and plugins) is in ``VARIABLES``."""
    sources = [*(REPO / "src").rglob("*.py"), *(REPO / "integrations").glob("*/src/**/*.py")]
    named = {name for path in sources for name in re.findall(r"CKPTPUB_[A-Z_]+", path.read_text())}
    assert named, "the scan found the variables"
    assert named <= VARIABLES.keys(), sorted(named - VARIABLES.keys())


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "sub" / "template.jinja").write_text("hi")
    (root / "ckptpub.json").write_text("{}")
    (tmp_path / "outside.json").write_text("{}")
    return root


def test_a_small_file_is_read_whole_and_bounded(folder: Path) -> None:
    path = str(folder / "config.json")
    assert read_bounded(path, 2, "config.json") == b"{}"
    with pytest.raises(CkptpubError, match=r"^config.json: 2 bytes is over the 1-byte limit for this file$"):
        read_bounded(path, 1, "config.json")


def test_a_fifo_a_symlink_and_nothing_are_refused_without_blocking(folder: Path) -> None:
    os.mkfifo(folder / "fifo")  # no writer: a blocking open would wait for ever
    with pytest.raises(CkptpubError, match="a named pipe"):
        read_bounded(str(folder / "fifo"), 100, "fifo")
    (folder / "link").symlink_to("config.json")
    with pytest.raises(OpenError, match="is a symlink") as link:
        read_bounded(str(folder / "link"), 100, "link")
    assert not link.value.absent
    with pytest.raises(OpenError) as nothing:
        read_bounded(str(folder / "none"), 100, "none")
    assert nothing.value.absent


def test_a_symlink_is_followed_only_inside_the_folder_and_never_to_ckptpub_files(folder: Path) -> None:
    (folder / "inside.json").symlink_to("config.json")
    (folder / "sub" / "up.jinja").symlink_to("../config.json")
    assert read_inside(str(folder), "inside.json", 100) == b"{}"
    assert read_inside(str(folder), "sub/up.jinja", 100) == b"{}"
    assert read_inside(str(folder), "sub/template.jinja", 100) == b"hi"
    (folder / "out.json").symlink_to("../outside.json")
    with pytest.raises(CkptpubError, match=r"^out.json: symlink points outside the checkpoint folder$"):
        read_inside(str(folder), "out.json", 100)
    (folder / "manifest.json").symlink_to("ckptpub.json")
    with pytest.raises(CkptpubError, match="symlink points at ckptpub.json, which publishing replaces"):
        read_inside(str(folder), "manifest.json", 100)
    (folder / "self").symlink_to(".")
    with pytest.raises(CkptpubError, match="outside the checkpoint folder"):
        resolve_inside(os.path.realpath(folder), str(folder / "self"), "self")
    (folder / "linked").symlink_to("sub")
    with pytest.raises(CkptpubError, match="in a folder behind a symlink"):
        read_inside(str(folder), "linked/template.jinja", 100)


def test_a_prefix_is_read_through_the_same_open(folder: Path) -> None:
    """``open_inside``: a shard's header is read without reading the shard, by the same rules."""
    (folder / "big.bin").write_bytes(b"head" + bytes(1000))
    (folder / "alias.bin").symlink_to("big.bin")
    fd, info = open_inside(str(folder), "alias.bin")
    try:
        assert (os.read(fd, 4), info.st_size) == (b"head", 1004)
    finally:
        os.close(fd)
    with pytest.raises(CkptpubError, match="over the 100-byte limit"):
        read_inside(str(folder), "alias.bin", 100)
