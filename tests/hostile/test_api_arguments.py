"""The Python API at its boundary: any argument it cannot use is a ``CkptpubError``, never another exception.

Generated: every public function x every kind of bad argument. The rule
(docs/security.md): path arguments accept ``str``, ``bytes`` and ``os.PathLike``;
anything else, and provenance that is not plain JSON data, raises ``CkptpubError``
with a one-line message naming the argument.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from support.checkpoints import deadline, write_checkpoint

import ckptpub


def self_holding_list() -> list:
    value: list = []
    value.append(value)
    return value


def self_holding_dict() -> dict:
    value: dict = {"a": {}}
    value["a"]["b"] = value
    return value


BAD_PATHS = {
    "None": None,
    "an int": 3,
    "an object": object(),
    "empty": "",
    "with NUL": "a\x00b",
    "a list": ["ckpt"],
}
BAD_OPTIONS = {
    "provenance with an object": {"provenance": {"x": object()}},
    "provenance with NaN": {"provenance": {"x": float("nan")}},
    "provenance with a non-string key": {"provenance": {1: 2}},
    "provenance a list": {"provenance": [1, 2]},
    "provenance a string": {"provenance": "step 10"},
    "provenance with a lone surrogate": {"provenance": {"x": "\udc80"}},
    "provenance nested 100000 deep": {
        "provenance": {"x": functools.reduce(lambda v, _: [v], range(100_000), 0)}
    },
    "provenance holding itself (a list)": {"provenance": {"x": self_holding_list()}},
    "provenance holding itself (a dict)": {"provenance": self_holding_dict()},
    "provenance holding itself deep inside": {"provenance": {"x": [{"y": [1, self_holding_list()]}]}},
    # No cycle, but [x, x] nested 60 deep names 2**60 items: refused once it passes the size bound.
    "provenance sharing its parts 2**60 times": {
        "provenance": {"x": functools.reduce(lambda v, _: [v, v], range(60), 0)}
    },
    "threads 0": {"threads": 0},
    "threads a string": {"threads": "4"},
    "on_progress not callable": {"on_progress": 5},
}
PATH_TAKERS = {
    "publish": lambda p: ckptpub.publish(p),
    "build_manifest": lambda p: ckptpub.build_manifest(p),
    "verify": lambda p: ckptpub.verify(p),
    "read_manifest": lambda p: ckptpub.read_manifest(p),
    "read_run_index": lambda p: ckptpub.read_run_index(p),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_checkpoint(tmp_path_factory.mktemp("api") / "ckpt")
    ckptpub.publish(folder)
    return folder


@pytest.mark.parametrize("function", PATH_TAKERS)
@pytest.mark.parametrize("bad", BAD_PATHS)
def test_bad_path_argument(function: str, bad: str) -> None:
    with pytest.raises(ckptpub.CkptpubError) as raised:
        PATH_TAKERS[function](BAD_PATHS[bad])
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("function", ["publish", "build_manifest"])
@pytest.mark.parametrize("bad", BAD_OPTIONS)
def test_bad_publish_option(folder: Path, function: str, bad: str) -> None:
    before = (folder / "ckptpub.json").read_bytes()
    with pytest.raises(ckptpub.CkptpubError) as raised, deadline(30, f"{function} with {bad}"):
        getattr(ckptpub, function)(folder, **BAD_OPTIONS[bad])
    assert "\n" not in str(raised.value)
    assert (folder / "ckptpub.json").read_bytes() == before


@pytest.mark.parametrize(
    "options", [{"expect_identity": 5}, {"expect_identity": "blake3:xyz"}, {"threads": -1}]
)
def test_bad_verify_option(folder: Path, options: dict) -> None:
    with pytest.raises(ckptpub.CkptpubError):
        ckptpub.verify(folder, **options)


@pytest.mark.parametrize(("a", "b"), [(None, "manifest"), ("manifest", {}), ("manifest", "a string")])
def test_diff_needs_manifests(folder: Path, a: object, b: object) -> None:
    manifest = ckptpub.read_manifest(folder)
    with pytest.raises(ckptpub.CkptpubError, match="must be a Manifest"):
        ckptpub.diff_manifests(manifest if a == "manifest" else a, manifest if b == "manifest" else b)


@pytest.mark.parametrize("convert", [str, os.fsencode, Path], ids=["str", "bytes", "Path"])
def test_every_path_type_gives_the_same_answer(folder: Path, convert) -> None:
    identity = ckptpub.read_manifest(folder).identity
    assert ckptpub.read_manifest(convert(folder)).identity == identity
    assert ckptpub.verify(convert(folder)).ok
    assert ckptpub.build_manifest(convert(folder)).identity == identity


def test_no_manifest_is_told_apart_from_an_unusable_one(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt")
    with pytest.raises(ckptpub.NoManifestError):
        ckptpub.read_manifest(folder)
    for make in (
        lambda p: p.mkdir(),
        lambda p: os.mkfifo(p),
        lambda p: os.symlink("gone", p),
        lambda p: p.write_text("{}"),
    ):
        target = folder / "ckptpub.json"
        make(target)
        with pytest.raises(ckptpub.CkptpubError) as raised:
            ckptpub.read_manifest(folder)
        assert not isinstance(raised.value, ckptpub.NoManifestError), raised.value
        target.rmdir() if target.is_dir() and not target.is_symlink() else target.unlink()


@pytest.mark.parametrize("name", ["two  spaces", "new\nline", "tab\tand\x1b[31mred"])
def test_errors_name_paths_exactly(tmp_path: Path, name: str) -> None:
    """A path in a message is that path: whitespace kept, only unprintable characters escaped as repr does."""
    missing = str(tmp_path / name)
    with pytest.raises(ckptpub.CkptpubError) as raised:
        ckptpub.verify(missing)
    message = str(raised.value)
    assert message.startswith(missing.encode("unicode_escape").decode("ascii") + ": "), message
    assert message.isprintable(), message


def test_every_public_name_is_there() -> None:
    """``ckptpub``'s names are loaded on first use (PEP 562): each one in ``__all__`` resolves."""
    for name in ckptpub.__all__:
        assert getattr(ckptpub, name) is not None, name
    assert set(ckptpub.__all__) <= set(dir(ckptpub))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ckptpub.nope  # noqa: B018
