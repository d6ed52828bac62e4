"""The CLI end to end, as a real subprocess on real checkpoint folders."""

from __future__ import annotations

import gc
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from support.checkpoints import (
    copy_checkpoint,
    flip_byte,
    locate,
    model_tensors,
    run_cli,
    tensor_range,
    write_checkpoint,
)

import ckptpub
import ckptpub._cli.main
from ckptpub.cli import main


@pytest.fixture
def published(tmp_path: Path) -> Path:
    folder = write_checkpoint(tmp_path / "ckpt", shards=3)
    result = run_cli("publish", folder)
    assert result.returncode == 0, result.stderr
    return folder


def test_publish_prints_identity_and_writes_manifest(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt")
    mtime = os.stat(folder).st_mtime_ns
    result = run_cli("publish", folder)
    assert result.returncode == 0
    identity = result.stdout.strip()
    assert identity.startswith("blake3:")
    assert len(identity) == 7 + 64
    manifest = json.loads((folder / "ckptpub.json").read_bytes())
    assert manifest["format"] == "ckptpub/3"
    assert manifest["identity"] == identity
    assert {f["path"] for f in manifest["files"]} == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "optimizer.pt",
        "logs/train.txt",
    }
    assert os.stat(folder).st_mtime_ns == mtime, "folder mtime must be restored for save_total_limit rotation"
    assert not [p for p in os.listdir(folder) if p.endswith(".tmp")]


def test_verify_ok_lists_every_file(published: Path) -> None:
    result = run_cli("verify", published)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "config.json: OK" in lines
    assert "model-00002-of-00003.safetensors: OK" in lines
    assert all(line.endswith(": OK") for line in lines)
    assert "OK" in result.stderr
    assert "identity blake3:" in result.stderr
    assert run_cli("verify", "--quiet", published).stdout == ""


def test_verify_names_the_changed_tensor(published: Path) -> None:
    shard = published / "model-00001-of-00003.safetensors"
    name = "model.embed_tokens.weight"
    begin, end = tensor_range(shard, name)
    flip_byte(shard, begin + 4000)  # deep inside the tensor, past its first KiB
    result = run_cli("verify", published)
    assert result.returncode == 1
    failed = [line for line in result.stdout.splitlines() if "FAILED" in line]
    assert failed == [f"model-00001-of-00003.safetensors: FAILED (tensor '{name}' bytes differ)"]
    report = json.loads(run_cli("verify", "--json", published).stdout)
    assert report["ok"] is False
    assert report["problems"] == [
        {
            "path": "model-00001-of-00003.safetensors",
            "kind": "tensor",
            "tensor": name,
            "detail": "bytes differ",
        }
    ]


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda f: (f / "tokenizer.json").write_text("{}"), "tokenizer.json: FAILED (size: "),
        (lambda f: flip_byte(f / "optimizer.pt", 100), "optimizer.pt: FAILED (changed: content differs)"),
        (lambda f: (f / "logs" / "train.txt").unlink(), "logs/train.txt: FAILED (missing: "),
        (lambda f: (f / "extra.bin").write_bytes(b"x"), "extra.bin: FAILED (added: "),
        (
            lambda f: os.truncate(f / "model-00003-of-00003.safetensors", 100),
            "model-00003-of-00003.safetensors: FAILED (size: ",
        ),
        (
            lambda f: flip_byte(f / "model-00002-of-00003.safetensors", 20),
            "model-00002-of-00003.safetensors: FAILED (header: ",
        ),
    ],
    ids=["rewritten", "flipped", "missing", "added", "truncated", "header"],
)
def test_verify_reports_each_kind_of_difference(published: Path, damage, expected: str) -> None:
    damage(published)
    result = run_cli("verify", "--quiet", published)
    assert result.returncode == 1, result.stderr
    assert any(line.startswith(expected) for line in result.stdout.splitlines()), result.stdout
    assert "Traceback" not in result.stderr


def test_verify_expect_identity(published: Path, tmp_path: Path) -> None:
    identity = run_cli("show", "--json", published).stdout
    identity = json.loads(identity)["identity"]
    assert run_cli("verify", "--expect-identity", identity, published).returncode == 0
    other = "blake3:" + "0" * 64
    result = run_cli("verify", "--expect-identity", other, published)
    assert result.returncode == 1
    assert "not the expected" in result.stdout
    assert run_cli("verify", "--expect-identity", "nonsense", published).returncode == 2


def test_show_and_diff(published: Path, tmp_path: Path) -> None:
    shown = json.loads(run_cli("show", "--json", published).stdout)
    assert shown["weights"] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert shown["tensors"] == 10
    text = run_cli("show", published).stdout
    lines = text.splitlines()
    assert lines[0].split() == ["identity:", shown["identity"]]
    assert lines[1].split(None, 1) == [
        "kind:",
        "model (no base recorded)",
    ]
    assert len({len(line) - len(line.split(":", 1)[1].lstrip()) for line in lines}) == 1, (
        "values start in one column"
    )
    assert "None" not in text

    other = copy_checkpoint(published, tmp_path / "other")
    shard, begin, _ = locate(other, "model.layers.0.mlp.up_proj.weight")
    flip_byte(shard, begin + 2000)
    assert run_cli("publish", other).returncode == 0
    result = run_cli("diff", published, other)
    assert result.returncode == 1
    assert result.stdout.splitlines() == ["changed  model.layers.0.mlp.up_proj.weight: bytes"]
    as_json = json.loads(run_cli("diff", "--json", published, other / "ckptpub.json").stdout)
    assert as_json["changed"] == ["model.layers.0.mlp.up_proj.weight"]
    assert as_json["added"] == []
    assert as_json["tensor_changes"][0]["what"] == "bytes"
    assert as_json["relation"] is None
    same = run_cli("diff", published, published)
    assert (same.returncode, same.stdout, same.stderr) == (0, f"same identity {shown['identity']}\n", "")


def test_ls_lists_steps_in_order(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for step in (10, 5, 20):
        write_checkpoint(run / f"checkpoint-{step}", extra_files=False)
        assert run_cli("publish", run / f"checkpoint-{step}").returncode == 0
    write_checkpoint(run / "checkpoint-25", extra_files=False)  # saved, not published
    result = run_cli("ls", run)
    assert result.returncode == 0
    header, *rows = [line.split() for line in result.stdout.splitlines()]
    assert header == ["STEP", "IDENTITY", "SIZE", "BASE", "NOTE", "PATH"]
    assert [(r[0], r[-1]) for r in rows] == [
        ("5", "checkpoint-5"),
        ("10", "checkpoint-10"),
        ("20", "checkpoint-20"),
    ]
    listed = json.loads(run_cli("ls", "--json", run).stdout)
    assert [r["step"] for r in listed] == [5, 10, 20]
    assert all(r["identity"].startswith("blake3:") for r in listed)


def test_usage_errors_are_one_line(tmp_path: Path) -> None:
    for args, says in [
        ((), "the following arguments are required: COMMAND (see 'ckptpub --help')"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
        (("verify",), "the following arguments are required: FOLDER (see 'ckptpub verify --help')"),
        (("publish", tmp_path / "nope"), f"{tmp_path / 'nope'}: No such file or directory"),
        (("verify", "--threads", "0", tmp_path), "argument --threads: '0' is not a positive integer"),
        (("verify", "--threads", "--json", tmp_path), "argument --threads: expected one argument"),
        (("verify", "--thread", "2", tmp_path), "unrecognized arguments: --thread"),  # no abbreviations
        (("show", tmp_path, "--jsn"), "unrecognized arguments: --jsn (see 'ckptpub show --help')"),
    ]:
        result = run_cli(*args)
        assert result.returncode == 2, args
        assert result.stderr.count("\n") == 1, (args, result.stderr)
        assert result.stderr.startswith("ckptpub: error: "), (args, result.stderr)
        assert says in result.stderr, (args, result.stderr)


def test_options_go_anywhere_and_double_dash_ends_them(published: Path, tmp_path: Path) -> None:
    assert run_cli("verify", published, "--quiet", "--threads=1").stdout == ""
    assert run_cli("verify", "--threads", "2", "--quiet", published).returncode == 0
    dash_named = tmp_path / "-ckpt"
    copy_checkpoint(published, dash_named)
    assert run_cli("verify", "--quiet", "--", dash_named.name, cwd=tmp_path).returncode == 0
    refused = run_cli("verify", dash_named.name, cwd=tmp_path)  # an option to argparse: no FOLDER left
    assert refused.returncode == 2
    assert "required: FOLDER" in refused.stderr


def test_help_and_version() -> None:
    top = run_cli("--help")
    assert top.returncode == 0
    assert top.stderr == ""
    assert top.stdout.startswith("usage: ckptpub [-h] [--version] COMMAND ...")
    assert all(f"  {name} " in top.stdout for name in ("publish", "verify", "show", "diff", "ls", "log"))
    verify_help = run_cli("verify", "--threads", "1", "-h")
    assert verify_help.returncode == 0
    assert verify_help.stdout.startswith("usage: ckptpub verify ")
    assert verify_help.stdout.split("\n\n")[0].endswith(" FOLDER"), verify_help.stdout
    assert "--expect-identity ID" in verify_help.stdout
    assert "--no-mmap" in verify_help.stdout
    version = run_cli("--version")
    assert (version.returncode, version.stdout) == (0, f"ckptpub {ckptpub.__version__}\n")


def test_errors_keep_paths_exactly(tmp_path: Path) -> None:
    """Two spaces stay two spaces; a newline or an escape sequence is escaped, so the error stays one line."""
    for name in ("two  spaces", "new\nline", "tab\tand\x1b[31mred"):
        missing = tmp_path / name
        result = run_cli("verify", missing)
        escaped = str(missing).encode("unicode_escape").decode("ascii")
        assert result.returncode == 2
        assert result.stderr == f"ckptpub: error: {escaped}: No such file or directory\n", result.stderr


def test_debug_variable_shows_the_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``CKPTPUB_DEBUG=1``: the traceback instead of the one line, and still exit 2 (never Python's 1)."""
    command = [sys.executable, "-m", "ckptpub", "verify", str(tmp_path / "nope")]
    env = dict(os.environ, CKPTPUB_DEBUG="1")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("Traceback (most recent call last):"), result.stderr
    assert result.stderr.splitlines()[-1].startswith("ckptpub.errors.CkptpubError: "), result.stderr
    for value in ("0", ""):  # off: the one line
        quiet = subprocess.run(command, capture_output=True, text=True, env=dict(env, CKPTPUB_DEBUG=value))
        assert quiet.returncode == 2
        assert quiet.stderr.count("\n") == 1, quiet.stderr
    monkeypatch.setenv("CKPTPUB_DEBUG", "1")
    with pytest.raises(ckptpub.CkptpubError):  # in process, main() re-raises: a debugger stops there
        main(["show", str(tmp_path / "nope")])


def test_debug_is_a_flag_that_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    """``CKPTPUB_DEBUG=false`` is off (it turned tracebacks on); a value neither on nor off is refused."""
    command = [sys.executable, "-m", "ckptpub", "show", str(tmp_path / "nope")]
    for value, traceback in (("false", False), (" Off ", False), ("no", False), ("on", True), ("TRUE", True)):
        result = subprocess.run(
            command, capture_output=True, text=True, env=dict(os.environ, CKPTPUB_DEBUG=value), timeout=60
        )
        assert result.returncode == 2, (value, result.stderr)
        shown = result.stderr.startswith("Traceback (most recent call last):")
        assert shown is traceback, (value, result.stderr)
        if not traceback:
            assert result.stderr == f"ckptpub: error: {tmp_path / 'nope'}: No such file or directory\n"
    result = subprocess.run(
        command, capture_output=True, text=True, env=dict(os.environ, CKPTPUB_DEBUG="maybe"), timeout=60
    )
    assert (result.returncode, result.stderr) == (
        2,
        "ckptpub: error: CKPTPUB_DEBUG: 'maybe' is neither on (1/true/yes/on) nor off (0/false/no/off)\n",
    )


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-5", "1e400", "soon"])
def test_a_duration_that_is_not_a_positive_finite_number_is_refused_in_one_line(value: str) -> None:
    result = run_cli("verify", f"--rank-timeout={value}", "folder")
    assert result.returncode == 2
    assert result.stderr == (
        f"ckptpub: error: argument --rank-timeout: {value!r} is not a positive number of seconds "
        "(at most 10000000) (see 'ckptpub verify --help')\n"
    ), result.stderr


def test_the_vllm_plugin_command_joins_the_parser() -> None:
    """``ckptpub preload`` (ckptpub-vllm, from ``make setup``) is listed, parsed and failed like the rest."""
    pytest.importorskip("ckptpub_vllm")
    assert "  preload " in run_cli("--help").stdout
    assert run_cli("preload", "--help").stdout.startswith("usage: ckptpub preload ")
    result = run_cli("preload", "--interval", "soon")
    assert (result.returncode, result.stderr) == (
        2,
        "ckptpub preload: error: argument --interval: 'soon' is not a positive number of seconds "
        "(at most 10000000) "
        "(see 'ckptpub preload --help')\n",
    )


def test_python_m_and_console_script_agree(published: Path) -> None:
    import shutil

    script = shutil.which("ckptpub", path=os.path.dirname(sys.executable))
    assert script, "the ckptpub console script is installed next to the interpreter"
    direct = subprocess.run([script, "show", "--json", published], capture_output=True, text=True)
    assert direct.returncode == 0
    assert json.loads(direct.stdout) == json.loads(run_cli("show", "--json", published).stdout)


def test_public_names_survive_submodule_imports() -> None:
    """Importing every submodule must not shadow a public function (``ckptpub.publish`` stays callable)."""
    import importlib
    import pkgutil

    import ckptpub

    for module in pkgutil.iter_modules(ckptpub.__path__):
        if module.name not in ("callback", "__main__"):
            importlib.import_module(f"ckptpub.{module.name}")
    for name in ckptpub.__all__:
        if name not in ("PublishCallback", "publish_accelerate_state"):
            assert type(getattr(ckptpub, name)).__name__ != "module", name
    assert callable(ckptpub.publish)
    assert callable(ckptpub.verify)


HELLO_COMMAND = """
from dataclasses import dataclass

from ckptpub.cli import Command, UsageError


@dataclass(frozen=True)
class HelloArguments:
    name: str
    times: int
    extra: list


def add_arguments(parser):
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("--times", type=int, default=1)


def run(args):
    if args.name == "nobody":
        raise UsageError("say hello to somebody")
    print(*["hello", args.name, *args.extra] * args.times)
    return 7


COMMAND = Command(
    "hello", "say hello", HelloArguments, add_arguments, run, program="ckptpub hello", passthrough=True
)
"""


def test_commands_from_other_distributions(tmp_path: Path) -> None:
    """A distribution adds ``ckptpub NAME`` through the ``ckptpub.commands`` entry-point group.

    Its sub-parser joins ckptpub's parser (help, usage errors, exit codes); arguments after
    ``--`` reach a ``passthrough`` command unparsed; its errors start with its own program name.
    """
    (tmp_path / "hello_cmd.py").write_text(HELLO_COMMAND)
    info = tmp_path / "hello_cmd-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hello-cmd\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[ckptpub.commands]\nhello = hello_cmd:COMMAND\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))

    def ckptpub_(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "ckptpub", *args]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)

    result = ckptpub_("hello", "world", "--times", "2", "--", "--not-an-option")
    assert (result.returncode, result.stdout) == (
        7,
        "hello world --not-an-option hello world --not-an-option\n",
    )
    usage = ckptpub_("hello", "world", "--times", "x")
    assert (usage.returncode, usage.stderr) == (
        2,
        "ckptpub hello: error: argument --times: invalid int value: 'x' (see 'ckptpub hello --help')\n",
    )
    refused = ckptpub_("hello", "nobody")
    assert (refused.returncode, refused.stderr) == (
        2,
        "ckptpub hello: error: say hello to somebody (see 'ckptpub hello --help')\n",
    )
    unknown = ckptpub_("nope")
    assert unknown.returncode == 2
    assert "invalid choice: 'nope'" in unknown.stderr
    assert "'hello'" in unknown.stderr
    listed = ckptpub_("--help")
    assert "  hello " in listed.stdout
    assert "say hello" in listed.stdout
    assert ckptpub_("hello", "--help").stdout.startswith("usage: ckptpub hello ")

    (info / "entry_points.txt").write_text("[ckptpub.commands]\nhello = hello_cmd:run\n")
    broken = ckptpub_("hello", "world")
    assert (broken.returncode, broken.stderr) == (
        2,
        "ckptpub: error: the entry point 'hello' (hello_cmd:run) is not a ckptpub Command\n",
    )
    assert ckptpub_("show", "--help").returncode == 0, "a built-in command never loads other distributions"


def test_ls_reads_the_run_index_and_checks_it_against_each_folder(tmp_path: Path) -> None:
    """The index names steps (rotated ones too); each folder's manifest must have the identity it recorded,
    and a folder the index reaches through a symlink is not followed."""
    from ckptpub._filesystem import run_index

    run = tmp_path / "run"
    ids = {}
    for step in (10, 20, 30):
        write_checkpoint(run / f"checkpoint-{step}", model_tensors(seed=step), extra_files=False)
        ids[step] = ckptpub.publish(run / f"checkpoint-{step}").identity
        run_index.append(run, step=step, path=f"checkpoint-{step}", identity=ids[step], time=0.0)
    run_index.append(run, step=40, path="checkpoint-40", identity=ids[30], time=0.0)  # rotated away since
    outside = tmp_path / "elsewhere"
    write_checkpoint(outside, extra_files=False)
    os.symlink(outside, run / "checkpoint-50")
    run_index.append(run, step=50, path="checkpoint-50", identity=ckptpub.publish(outside).identity, time=0.0)
    run_index.append(
        run, step=20, path="checkpoint-20", identity=ids[10], time=0.0
    )  # not what the folder holds
    result = run_cli("ls", run)
    assert result.returncode == 2
    assert result.stderr == (f"ckptpub: 2 published checkpoints under {run}, 1 rotated away, 2 unusable\n")
    rows = [line.split() for line in result.stdout.splitlines()[1:] if not line.startswith("#")]
    assert [(r[0], r[1], r[-2], r[-1]) for r in rows] == [
        ("10", ids[10][:19], "-", "checkpoint-10"),
        ("20", "UNUSABLE", "error", "checkpoint-20"),
        ("30", ids[30][:19], "-", "checkpoint-30"),
        ("40", ids[30][:19], "gone", "checkpoint-40"),
        ("50", "UNUSABLE", "error", "checkpoint-50"),
    ]
    notes = [line for line in result.stdout.splitlines() if line.startswith("#")]
    assert notes == [
        f"# checkpoint-20: ckptpub.json has identity {ids[20]}, the run index recorded {ids[10]}",
        "# checkpoint-50: reached through a symlink; not followed out of the run folder",
    ]
    listed = json.loads(run_cli("ls", "--json", run).stdout)
    assert [(r["step"], r["status"], r["source"]) for r in listed] == [
        (10, "ok", "index"),
        (20, "unusable", "index"),
        (30, "ok", "index"),
        (40, "gone", "index"),
        (50, "unusable", "index"),
    ]


def test_a_missing_file_is_a_problem_not_a_checked_file(published: Path) -> None:
    listed = len(ckptpub.read_manifest(published).files)
    (published / "logs" / "train.txt").unlink()
    report = ckptpub.verify(published)
    assert "logs/train.txt" not in report.checked
    assert len(report.checked) == listed - 1
    result = run_cli("verify", published)
    assert f"FAILED, 1 problem (0 tensors changed) in {listed - 1} files" in result.stderr, result.stderr
    assert (
        "logs/train.txt: FAILED (missing: in the manifest but not in the folder)"
        in result.stdout.splitlines()
    )


def test_verify_counts_problems_in_english(published: Path, tmp_path: Path) -> None:
    other = copy_checkpoint(published, tmp_path / "other")
    shard, begin, _ = locate(other, "model.layers.0.mlp.up_proj.weight")
    flip_byte(shard, begin + 2000)
    result = run_cli("verify", other)
    assert result.returncode == 1
    assert ", 1 problem (1 tensor changed) in " in result.stderr, result.stderr


def test_one_shot_commands_run_without_the_cycle_collector_and_restore_it(
    published: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verify builds records that hold no cycle: the collector is off while it runs, as it was after."""
    seen: list[bool] = []
    real_verify = ckptpub._cli.main.verify

    def verify_noting_the_collector(*args: object, **kwargs: object) -> object:
        seen.append(gc.isenabled())
        return real_verify(*args, **kwargs)

    monkeypatch.setattr(ckptpub._cli.main, "verify", verify_noting_the_collector)
    assert gc.isenabled()
    assert main(["verify", str(published)]) == 0
    assert seen == [False]
    assert gc.isenabled()


def test_zero_size_tensors_in_any_header_order_verify(tmp_path: Path) -> None:
    """Tensors of no bytes share an offset; a writer may list them in any order, not by name."""
    header = {
        "w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [0], "data_offsets": [16, 16]},
        "a": {"dtype": "F32", "shape": [0], "data_offsets": [16, 16]},
        "z": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]},
    }
    encoded = json.dumps(header).encode()
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(encoded)) + encoded + bytes(range(24)))
    (folder / "config.json").write_text("{}")
    assert run_cli("publish", folder).returncode == 0
    verified = run_cli("verify", folder)
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize("extra", ["extra.safetensors", "sub/extra.safetensors"])
def test_a_safetensors_file_without_tensors_verifies(tmp_path: Path, extra: str) -> None:
    """A shard whose header lists no tensor (a weight file at the top, another file below) is valid."""
    folder = write_checkpoint(tmp_path / "ckpt")
    empty = json.dumps({"__metadata__": {"format": "pt"}}).encode()
    (folder / extra).parent.mkdir(exist_ok=True)
    (folder / extra).write_bytes(struct.pack("<Q", len(empty)) + empty)
    assert run_cli("publish", folder).returncode == 0
    verified = run_cli("verify", folder)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "OK" in verified.stderr


def test_a_manifest_that_lists_a_shard_without_its_tensors_is_named(tmp_path: Path) -> None:
    """A forged manifest: a shard's tensors left out, its header digest stretched over the whole file."""
    from blake3 import blake3

    from ckptpub._format.manifest import FileRecord, Manifest, compute_identity

    folder = write_checkpoint(tmp_path / "ckpt")
    header = json.dumps({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (folder / "sub").mkdir()
    (folder / "sub" / "extra.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    published = ckptpub.publish(folder)
    whole = (folder / "sub" / "extra.safetensors").read_bytes()
    files = tuple(
        FileRecord(f.path, f.size, "blake3:" + blake3(whole).hexdigest(), f.size)
        if f.path == "sub/extra.safetensors"
        else f
        for f in published.files
    )
    tensors = tuple(t for t in published.tensors if t.file != "sub/extra.safetensors")
    identity = compute_identity(tensors, files, published.weights, published.config)
    forged = Manifest(identity, tensors, files, published.weights, published.config, published.provenance)
    (folder / "ckptpub.json").write_bytes(forged.to_json())
    verified = run_cli("verify", folder)
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert (
        "sub/extra.safetensors: FAILED (manifest: tensor entries do not match the file's header)"
        in verified.stdout
    )


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-32"])
def test_an_index_that_is_not_plain_utf8_is_refused(tmp_path: Path, encoding: str) -> None:
    """transformers and vLLM read the index as UTF-8 JSON; ckptpub must not read it some other way."""
    folder = write_checkpoint(tmp_path / "ckpt", shards=2)
    index = folder / "model.safetensors.index.json"
    index.write_bytes(index.read_text().encode(encoding))
    result = run_cli("publish", folder)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("ckptpub: error: model.safetensors.index.json: index is not valid"), (
        result.stderr
    )
