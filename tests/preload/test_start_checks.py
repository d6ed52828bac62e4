"""Failures no retry can heal stop ``ckptpub preload`` at once: exit 2, one line, within a bounded time.

Each case is a real supervisor process: checked before the first daemon (a daemon command
that does not exist, an adapter given as the model, a model published in a format from
before ``ckptpub/3`` settled, arguments with which a daemon would load unverified bytes,
and, asked of vLLM by the default command's probe, a vLLM
that cannot be imported and a platform without CUDA IPC, the CPU build without the test
shim), and read from a daemon that exited (a module it cannot import). A transient
failure, for contrast, backs off (``test_preload_process.py``).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from support.checkpoints import with_retired_manifest
from support.preload_helpers import SupervisorProc, make_adapter, make_checkpoint

#: Generous for two heavily loaded cores (the probe imports torch and vLLM, 25 s unloaded); far below a
#: retry back-off, which nothing here may wait for.
BOUND_S = 300


def run_to_exit(sup: SupervisorProc) -> tuple[int, list[str], float]:
    """Run the supervisor until it exits: (exit code, stderr lines, seconds taken)."""
    started = time.monotonic()
    done = subprocess.run(sup.argv, capture_output=True, text=True, env=sup.env, timeout=BOUND_S)
    return done.returncode, done.stderr.strip().splitlines(), time.monotonic() - started


def assert_one_line_exit_2(code: int, lines: list[str], seconds: float, *expected: str) -> None:
    assert code == 2, lines
    assert seconds < BOUND_S
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1, lines
    assert errors[0].startswith("ckptpub preload: error:"), errors
    assert lines[-1] == errors[0], lines  # the last thing it says
    for text in expected:
        assert text in errors[0], errors[0]
    assert not any("Traceback" in line for line in lines)


def test_a_daemon_command_that_does_not_exist(tmp_path):
    model = tmp_path / "model"
    make_checkpoint(model)
    sup = SupervisorProc(tmp_path, [str(model)], daemon_cmd="no-such-daemon-ckptpub --model {folder}")
    assert_one_line_exit_2(
        *run_to_exit(sup), "'no-such-daemon-ckptpub' is not a command that can be run here"
    )
    assert not (sup.state_dir / "logs").exists()  # no daemon was started


def test_an_adapter_given_as_the_model(tmp_path):
    base = tmp_path / "base"
    base_identity = make_checkpoint(base)
    adapter = tmp_path / "adapter"
    make_adapter(adapter, base, base_identity)
    sup = SupervisorProc(tmp_path, [str(adapter)])
    assert_one_line_exit_2(*run_to_exit(sup), "is an adapter", f"preload its base {base_identity}")


@pytest.mark.parametrize(
    ("passthrough", "what"),
    [
        (["--load-format", "runai_streamer"], "--load-format runai_streamer"),
        (["--load_format=tensorizer"], "--load-format tensorizer"),
        (
            ["--model-loader-extra-config", '{"enable_multithread_load": true}'],
            "--load-format auto with --model-loader-extra-config",
        ),
    ],
    ids=["another loader", "underscore spelling", "auto with extra config"],
)
def test_daemon_arguments_that_would_load_unverified_bytes(tmp_path, passthrough, what):
    """Issue 32 item 1: a daemon keyed by the manifest's identity refuses such a load on every retry
    (tests/vllm/test_daemon.py), so the supervisor refuses the arguments before its first daemon."""
    model = tmp_path / "model"
    make_checkpoint(model)
    sup = SupervisorProc(tmp_path, [str(model)], passthrough=passthrough)
    assert_one_line_exit_2(
        *run_to_exit(sup),
        f"loads only through a verifying loader, and {what} does not verify; pass --load-format "
        "manifest_cache",
    )
    assert not (sup.state_dir / "logs").exists()  # no daemon was started


@pytest.mark.parametrize("version", ["ckptpub/1", "ckptpub/2"])
def test_a_model_published_in_a_retired_format(tmp_path, version):
    """The core's one line: the format, and the command that publishes the folder again."""
    model = tmp_path / "model"
    make_checkpoint(model)
    with_retired_manifest(model, version)
    sup = SupervisorProc(tmp_path, [str(model)])
    code, lines, seconds = run_to_exit(sup)
    assert_one_line_exit_2(
        code,
        lines,
        seconds,
        f"{model / 'ckptpub.json'}: format {version!r} is no longer read (ckptpub reads 'ckptpub/3'); "
        f"publish it again: ckptpub publish {model}",
    )
    assert not (sup.state_dir / "logs").exists()  # no daemon was started


def test_a_module_the_daemon_cannot_import_ends_the_supervisor(tmp_path):
    model = tmp_path / "model"
    make_checkpoint(model)
    command = f"{sys.executable} -c 'import ckptpub_no_such_module' {{folder}}"
    sup = SupervisorProc(tmp_path, [str(model)], daemon_cmd=command, extra_opts=["--retry-delay", "1"])
    code, lines, seconds = run_to_exit(sup)
    assert_one_line_exit_2(
        code,
        lines,
        seconds,
        "cannot succeed on retry: the daemon cannot import what it needs: ModuleNotFoundError: "
        "No module named 'ckptpub_no_such_module'",
    )
    assert len(list((sup.state_dir / "logs").glob("daemon-*.log"))) == 1  # not retried


@pytest.fixture
def without_vllm(tmp_path):
    """A ``vllm`` package that cannot be imported first on the path: a broken installation."""
    fake = tmp_path / "broken-site" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'vllm._C'\")\n")
    return str(fake.parent)


def test_default_command_with_a_vllm_that_cannot_be_imported(tmp_path, without_vllm):
    pytest.importorskip("vllm")
    model = tmp_path / "model"
    make_checkpoint(model)
    sup = SupervisorProc(tmp_path, [str(model)], daemon_cmd=None, env={"PYTHONPATH": without_vllm})
    assert_one_line_exit_2(
        *run_to_exit(sup), "the daemon cannot import vLLM's weight cache: ModuleNotFoundError"
    )


@pytest.mark.slow
def test_default_command_on_a_platform_without_cuda_ipc(tmp_path):
    """The CPU build without the test shim: vLLM's own check says the daemon cannot share weights."""
    pytest.importorskip("vllm")
    model = tmp_path / "model"
    make_checkpoint(model)
    sup = SupervisorProc(tmp_path, [str(model)], daemon_cmd=None)
    assert_one_line_exit_2(
        *run_to_exit(sup), "this platform cannot share weights with engines", "does not support CUDA IPC"
    )
