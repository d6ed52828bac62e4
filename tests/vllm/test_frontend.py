"""Refusals where operators look, and the served identity where tools look (issue 21, items 5 and 6).

Real vLLM CPU engines started the way operators start them, with the engine core in a
process of its own (vLLM's default, unlike ``run_engine.py``'s in-process core):

* the offline API: the exception ``LLM(...)`` raises, the last thing a caller sees, is
  the refusal in one line, for a refusal made in the engine's worker while it loads (a
  tensor that differs: relayed by the worker to the process that started it) and for
  one made at config time (a pin that does not match, a bad option value, before any
  engine process starts);
* the OpenAI server: a refused start's last output line is the refusal, and a served
  model's identity is in ``/metrics`` (``ckptpub:served_info``) and on its
  ``/v1/models`` card.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from support.checkpoints import with_retired_manifest
from support.vllm_engine_helpers import TINY_ENGINE, engine_flags, run_engines

import ckptpub

pytestmark = pytest.mark.slow  # vLLM engines and the OpenAI server

SERVER = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
ENGINE_ARGS = ["--load-format", "manifest_cache", *engine_flags(TINY_ENGINE)]
OTHER = "blake3:" + "1" * 64


@pytest.fixture(scope="module")
def retired(models, tmp_path_factory):
    """v1 with the manifest a ckptpub/2 writer wrote (the format before ckptpub/3: never released)."""
    folder = tmp_path_factory.mktemp("retired") / "v1"
    shutil.copytree(models["v1"], folder)
    return str(with_retired_manifest(folder, "ckptpub/2"))


@pytest.fixture(scope="module")
def relay_planted(tmp_path_factory):
    """``CKPTPUB_REFUSAL_FILE`` set, in the environment the engines start from, to a symlink to a file
    outside (issue 34): the relay must neither empty nor write it, and still relay the worker's refusal."""
    folder = tmp_path_factory.mktemp("relay")
    outside = folder / "outside.jsonl"
    outside.write_text("outside: never written\n")
    os.symlink(outside, folder / "planted.jsonl")
    return folder


@pytest.fixture(scope="module")
def offline(models, retired, relay_planted):
    """One process, six engine starts with the engine core in its own process (vLLM's default)."""
    jobs = [  # the engine process of the last one is the only one started
        {"model": models["v1"], "load_format": "manifest_cache", "extra": {"expect_identity": OTHER}},
        {"model": models["v1"], "load_format": "manifest_cache", "extra": {"hash_threads": 0}},
        {
            "model": models["v1"],
            "load_format": "manifest_cache",
            "env": {"CKPTPUB_REQUIRE_MANIFEST": "maybe"},
        },
        {"model": models["linked_templates"], "load_format": "manifest_cache"},
        {"model": retired, "load_format": "manifest_cache"},
        {
            "model": models["tampered"],
            "load_format": "manifest_cache",
        },  # refused in the worker, while loading
    ]
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
        "CKPTPUB_REFUSAL_FILE": str(relay_planted / "planted.jsonl"),
    }
    results, log = run_engines(jobs, env=env, timeout=1500)
    return results, log.split("CKPTPUB_RESULT ")


def test_offline_refusal_in_the_worker_is_what_the_caller_gets(offline, models):
    (*_, tampered), logs = offline
    assert tampered["error"].startswith(
        f"RefusedError: ckptpub: refusing to serve {models['tampered']}: tensor 'model.norm.weight' differs"
    ), tampered
    assert "WorkerProc initialization failed" in logs[-1]  # it happened in the engine's own processes


def test_the_relay_never_writes_through_a_symlink_the_variable_names(offline, relay_planted):
    """The refusal above was relayed through a file the start made, not the planted name (issue 34)."""
    assert (relay_planted / "outside.jsonl").read_text() == "outside: never written\n"
    assert os.path.islink(relay_planted / "planted.jsonl")


def test_offline_refusals_at_config_time_come_before_any_engine_process(offline, models):
    (pinned, bad_option, bad_flag, linked_templates, _, _), logs = offline
    identity = ckptpub.read_manifest(models["v1"]).identity
    assert pinned["error"] == (
        f"RefusedError: ckptpub: refusing to serve {models['v1']}: its identity {identity} is not the "
        f"expected {OTHER}"
    )
    assert (
        bad_option["error"]
        == "ValueError: manifest_cache option 'hash_threads' must be a positive integer, got 0"
    )
    assert bad_flag["error"] == (  # fail closed: a flag neither on nor off is the core's refusal, in one line
        "ValueError: CKPTPUB_REQUIRE_MANIFEST: 'maybe' is neither on (1/true/yes/on) nor off (0/false/no/off)"
    )
    assert linked_templates["error"] == (  # what `ckptpub verify` refuses too (test_units)
        f"RefusedError: ckptpub: refusing to serve {models['linked_templates']}: "
        "additional_chat_templates/tool_use.jinja: in a folder behind a symlink; not supported in a "
        f"checkpoint folder; run `ckptpub verify {models['linked_templates']}`"
    )
    for log in logs[:5]:
        assert "EngineCore" not in log, log[-2000:]  # no engine process was started


def test_offline_a_folder_in_a_retired_format_is_refused_at_config_time_in_one_line(offline, retired):
    """The core's one line, naming the format and the command that publishes the folder again."""
    (*_, refused, _), _ = offline
    assert refused["error"] == (
        f"RefusedError: ckptpub: refusing to serve {retired}: its ckptpub.json is unusable: "
        f"{retired}/ckptpub.json: format 'ckptpub/2' is no longer read (ckptpub reads 'ckptpub/3'); "
        f"publish it again: ckptpub publish {retired}"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The OpenAI server on one folder, in a session of its own, its output in a file."""

    def __init__(self, folder: str, log_path, *extra: str) -> None:
        self.port = _free_port()
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [*SERVER, "--model", folder, "--port", str(self.port), *ENGINE_ARGS, *extra],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as response:
            return response.read().decode()

    def wait_up(self, timeout: float = 1200) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.lines()[-30:]
            try:
                self.get("/health")
                return
            except OSError:
                time.sleep(1)
        raise AssertionError(f"the server did not come up:\n{self.lines()[-30:]}")

    def lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").strip().splitlines()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


def test_the_server_shows_the_served_identity_in_metrics_and_model_cards(models, tmp_path):
    folder = shutil.copytree(models["v1"], tmp_path / "served")
    identity = ckptpub.read_manifest(folder).identity
    server = Server(str(folder), tmp_path / "server.log", "--served-model-name", "tiny")
    try:
        server.wait_up()
        (card,) = json.loads(server.get("/v1/models"))["data"]
        metrics = server.get("/metrics")
    finally:
        server.stop()
    assert card["id"] == "tiny"
    assert card["ckptpub"] == {"identity": identity, "kind": "model", "base_identity": None}
    (line,) = [m for m in metrics.splitlines() if m.startswith("ckptpub:served_info{")]
    assert line == (
        f'ckptpub:served_info{{base_identity="",folder="{folder}",identity="{identity}",kind="model",'
        f'name="tiny"}} 1.0'
    )


def test_a_refused_server_start_ends_with_the_reason(models, tmp_path):
    """A pin that does not match: refused at config time, the last line of the server's output."""
    server = Server(
        models["v1"],
        tmp_path / "refused.log",
        "--model-loader-extra-config",
        json.dumps({"expect_identity": OTHER}),
    )
    try:
        code = server.proc.wait(timeout=600)
    finally:
        server.stop()
    lines = server.lines()
    assert code != 0
    identity = ckptpub.read_manifest(models["v1"]).identity
    assert lines[-1] == (
        f"ckptpub.serving.RefusedError: ckptpub: refusing to serve {models['v1']}: its identity "
        f"{identity} is not the expected {OTHER}"
    ), lines[-5:]
    assert not any("EngineCore" in line for line in lines)  # before any engine process
