"""The same folder in every locale and output condition.

The same manifest, one-line errors, and exit 1 only for a difference, everywhere.

Generated: every environment below x every verb, as real subprocesses of
``python -m ckptpub`` with a timeout (a hang fails). Names are read as bytes and
decoded as strict UTF-8, so a Latin-1 or ASCII locale neither changes the manifest
nor refuses a valid name; output the terminal cannot encode is escaped; a closed or
full stdout/stderr never turns into a traceback or a false verdict.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.checkpoints import write_checkpoint

from tests.hostile.corpus import flip_tensor as flip_tensor_bytes

NAMES = ("café.txt", "日本/設定.json", "emoji-😀.bin", "tab\there.txt")


def latin1_locale() -> dict[str, str] | None:
    """An ISO-8859-1 locale built with localedef under a private LOCPATH (None where that cannot be done)."""
    where = Path(os.environ.get("TMPDIR", "/tmp")) / f"ckptpub-locales-{os.getuid()}"
    if not (where / "en_US.ISO-8859-1").is_dir():
        localedef = shutil.which("localedef")
        if localedef is None:
            return None
        where.mkdir(exist_ok=True)
        subprocess.run(
            [localedef, "-i", "en_US", "-f", "ISO-8859-1", str(where / "en_US.ISO-8859-1")],
            capture_output=True,
            timeout=120,
        )
        if not (where / "en_US.ISO-8859-1").is_dir():
            return None
    return {"LOCPATH": str(where), "LC_ALL": "en_US.ISO-8859-1"}


ENVIRONMENTS = {
    "C.UTF-8": {"LC_ALL": "C.UTF-8"},
    "C": {"LC_ALL": "C"},
    "C without UTF-8 mode": {"LC_ALL": "C", "PYTHONUTF8": "0"},
    "Latin-1": latin1_locale(),
    "ascii output": {"PYTHONIOENCODING": "ascii"},
}


def run(env_name: str, *args: str, **streams) -> subprocess.CompletedProcess:
    extra = ENVIRONMENTS[env_name]
    if extra is None:
        pytest.skip(f"{env_name}: no such locale here and localedef could not build it")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LC_", "LANG", "PYTHONIOENCODING", "PYTHONUTF8"))
    }
    env.update(extra)
    streams.setdefault("stdout", subprocess.PIPE)
    streams.setdefault("stderr", subprocess.PIPE)
    return subprocess.run(
        [sys.executable, "-m", "ckptpub", *args], env=env, timeout=60, stdin=subprocess.DEVNULL, **streams
    )


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_checkpoint(tmp_path_factory.mktemp("env") / "ckpt")
    for name in NAMES:
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(name)
    return folder


def without_provenance(folder: Path) -> dict:
    document = json.loads((folder / "ckptpub.json").read_bytes())
    document.pop("provenance")
    return document


@pytest.mark.parametrize("env_name", ENVIRONMENTS)
def test_same_manifest_and_clean_output_in_every_environment(
    tmp_path: Path, named: Path, env_name: str
) -> None:
    reference = tmp_path / "reference"
    shutil.copytree(named, reference)
    assert run("C.UTF-8", "publish", str(reference)).returncode == 0
    folder = tmp_path / "ckpt"
    shutil.copytree(named, folder)
    published = run(env_name, "publish", str(folder))
    assert published.returncode == 0, published.stderr
    assert without_provenance(folder) == without_provenance(reference), env_name
    for verb in (
        ["verify", str(folder)],
        ["show", str(folder)],
        ["ls", str(tmp_path)],
        ["diff", str(reference), str(folder)],
    ):
        result = run(env_name, *verb)
        assert result.returncode == 0, (env_name, verb, result.stderr)
        assert b"Traceback" not in result.stderr
        assert b"internal error" not in result.stderr
    flip_tensor_bytes(folder)
    failed = run(env_name, "verify", str(folder))
    assert failed.returncode == 1
    assert b"FAILED" in failed.stdout
    assert b"Traceback" not in failed.stderr


@pytest.mark.parametrize("env_name", ENVIRONMENTS)
def test_invalid_names_refused_alike_in_every_environment(tmp_path: Path, named: Path, env_name: str) -> None:
    folder = tmp_path / "ckpt"
    shutil.copytree(named, folder)
    open(os.path.join(os.fsencode(folder), b"caf\xe9.txt"), "wb").close()  # Latin-1 bytes: not UTF-8
    result = run(env_name, "publish", str(folder))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count(b"\n") == 1
    assert b"file name is not valid UTF-8" in result.stderr
    assert not (folder / "ckptpub.json").exists()


def closed(fd: int):
    return lambda: os.close(fd)


#: What stdout/stderr are: (description, Popen keyword arguments).
STREAMS = {
    "stdout closed": {"preexec_fn": closed(1)},
    "stderr closed": {"preexec_fn": closed(2)},
    "stdout full": {"stdout_path": "/dev/full"},
    "stderr full": {"stderr_path": "/dev/full"},
    "both full": {"stdout_path": "/dev/full", "stderr_path": "/dev/full"},
}


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("verb", ["publish", "verify", "verify-mismatch", "show", "ls", "bad-folder"])
def test_closed_or_full_streams(tmp_path: Path, named: Path, stream: str, verb: str) -> None:
    """Exit codes keep their meaning whatever happens to the output; lost stdout is told on stderr (2),
    but for publish, whose manifest landed: a warning, exit 0."""
    folder = tmp_path / "ckpt"
    shutil.copytree(named, folder)
    if verb != "publish":
        assert run("C.UTF-8", "publish", str(folder)).returncode == 0
    if verb == "verify-mismatch":
        flip_tensor_bytes(folder)
    args = {
        "publish": ["publish", str(folder)],
        "verify": ["verify", str(folder)],
        "verify-mismatch": ["verify", str(folder)],
        "show": ["show", str(folder)],
        "ls": ["ls", str(tmp_path)],
        "bad-folder": ["verify", str(tmp_path / "none")],
    }[verb]
    options = dict(STREAMS[stream])
    with contextlib.ExitStack() as handles:
        for name in ("stdout", "stderr"):
            path = options.pop(f"{name}_path", None)
            if path is not None:
                options[name] = handles.enter_context(open(path, "wb"))
        result = run("C.UTF-8", *args, **options)
    stdout_lost = "stdout full" in stream or stream == "both full"
    expected = {"verify-mismatch": 1, "bad-folder": 2}.get(verb, 2 if stdout_lost else 0)
    if verb == "publish":
        expected = 0  # the manifest landed: published, with a warning when the identity could not be printed
    if verb == "verify-mismatch" and stdout_lost:
        expected = 2  # the FAILED lines could not be written: no verdict was delivered
    assert result.returncode == expected, (stream, verb, result.returncode, result.stderr)
    if isinstance(result.stderr, bytes) and result.stderr:
        assert b"Traceback" not in result.stderr
        assert b"internal error" not in result.stderr
        assert result.stderr.startswith(b"ckptpub: "), result.stderr
    if verb == "publish":  # the manifest landed whatever happened to the output, and it verifies
        assert run("C.UTF-8", "verify", str(folder)).returncode == 0
