"""LoRA adapters through ``manifest_cache`` in real vLLM CPU engines and the real OpenAI server.

Adapters are PEFT adapters of the tiny Qwen3 made here (random ``lora_B``, so each
changes the answers), published with ``ckptpub publish ADAPTER --base BASE``. One
offline engine (``run_lora.py``: front end here, engine core and worker in their own
processes, as users run vLLM) serves them all with vLLM's defaults (``max_loras`` =
``max_cpu_loras`` = 1, so each new adapter evicts the last); an ``auto`` engine
before it gives the reference tokens. Nothing of vLLM is mocked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from support.vllm_engine_helpers import api_server, complete, completion_tokens, post

import ckptpub
from tests.vllm.lora_helpers import TAMPERED_LORA_B, build_adapter, flip_bit, publish

pytestmark = pytest.mark.slow  # vLLM engines and the OpenAI server

HERE = Path(__file__).parent
IDS = {"good": 1, "second": 2, "tampered": 3, "config": 4, "wrong_base": 5, "nomanifest": 6, "nobase": 7}
IDS |= {"pinned": 8, "evicted": 9, "by_path": 10, "rank_lie": 11}


@pytest.fixture(scope="module")
def lora(lora_folders, tmp_path_factory) -> dict[str, str]:
    """The shared folders, and: ``evicted`` (a copy of good), ``by_path`` (second, pinned by its path
    to good's identity) with ``link`` (a symlink to it) and ``parent_link`` (to its parent), and
    ``rank_lie`` (rank-16 tensors, ``r: 8`` in its config, published with ``--base``)."""
    run = tmp_path_factory.mktemp("lora_run")
    evicted = shutil.copytree(lora_folders["good"], str(run / "evicted"))
    by_path = shutil.copytree(lora_folders["second"], str(run / "pinned" / "by_path"))
    os.symlink(by_path, run / "link")
    os.symlink(run / "pinned", run / "parent_link")
    rank_lie = build_adapter(lora_folders["base"], str(run / "rank_lie"), seed=3, rank=16)
    config_path = Path(rank_lie) / "adapter_config.json"
    config_path.write_text(json.dumps(dict(json.loads(config_path.read_text()), r=8)))
    publish(rank_lie, "--base", lora_folders["base"])
    return dict(
        lora_folders,
        evicted=evicted,
        by_path=by_path,
        link=str(run / "link"),
        parent_link=str(run / "parent_link"),
        rank_lie=rank_lie,
    )


def _lora(folders: dict[str, str], name: str, path: str | None = None) -> list:
    return [name, IDS[name], path or folders[name]]


def _identity(folder: str) -> str:
    return ckptpub.read_manifest(folder).identity


@pytest.fixture(scope="module")
def offline(lora) -> tuple[dict[str, dict], dict[str, dict], str]:
    """Reference tokens from ``auto``, then every case through one ``manifest_cache`` engine."""
    evicted_weights = os.path.join(lora["evicted"], "adapter_model.safetensors")
    gen = {"op": "generate"}
    auto = {
        "base": dict(gen, lora=None),
        "good": dict(gen, lora=_lora(lora, "good")),
        "second": dict(gen, lora=_lora(lora, "second")),
        "tampered": dict(gen, lora=_lora(lora, "tampered")),
    }
    ours = {
        "base": dict(gen, lora=None),
        "good": dict(gen, lora=_lora(lora, "good")),
        # good is held under id 1: another folder, or a name pinned otherwise, under id 1 is refused
        "id_held_other_folder": dict(gen, lora=["good", IDS["good"], lora["second"]]),
        "id_held_spelt_otherwise": dict(gen, lora=["good", IDS["good"], lora["good"] + "/../good"]),
        "id_held_pinned_name": dict(gen, lora=["pinned_second", IDS["good"], lora["good"]]),
        # a folder pinned by its path, asked for through a symlink and through a symlinked parent
        "by_path_link": dict(gen, lora=["by_path", IDS["by_path"], lora["link"]]),
        "by_path_parent_link": dict(gen, lora=["by_path", IDS["by_path"], lora["parent_link"] + "/by_path"]),
        # an activation that fails half-way: refused each time, nothing left that answers
        "rank_lie": dict(gen, lora=_lora(lora, "rank_lie")),
        "rank_lie_again": dict(gen, lora=_lora(lora, "rank_lie")),
        "add_rank_lie": {"op": "add_lora", "lora": _lora(lora, "rank_lie")},  # the explicit add: the same
        "add_rank_lie_again": {"op": "add_lora", "lora": _lora(lora, "rank_lie")},
        "good_after_rank_lie": dict(gen, lora=_lora(lora, "good")),
        "tampered": dict(gen, lora=_lora(lora, "tampered")),
        "config": dict(gen, lora=_lora(lora, "config")),
        "wrong_base": dict(gen, lora=_lora(lora, "wrong_base")),
        "nomanifest": dict(gen, lora=_lora(lora, "nomanifest")),
        "nobase": dict(gen, lora=_lora(lora, "nobase")),
        "pinned": dict(gen, lora=_lora(lora, "pinned", lora["second"])),
        # evicted: read (verified), evicted by second, tampered on disk, then asked for again
        "evicted_first": dict(gen, lora=_lora(lora, "evicted")),
        "second": dict(gen, lora=_lora(lora, "second")),
        "tamper_evicted": {"op": "flip", "file": evicted_weights, "tensor": TAMPERED_LORA_B},
        "evicted_tampered": dict(gen, lora=_lora(lora, "evicted")),
        "restore_evicted": {"op": "flip", "file": evicted_weights, "tensor": TAMPERED_LORA_B},
        "evicted_restored": dict(gen, lora=_lora(lora, "evicted")),
        "add_tampered": {"op": "add_lora", "lora": _lora(lora, "tampered")},
        "second_after": dict(gen, lora=_lora(lora, "second")),
        "base_after": dict(gen, lora=None),
    }
    pins = {lora["good"]: _identity(lora["good"]), "pinned": _identity(lora["good"])}
    pins |= {lora["by_path"]: _identity(lora["good"]), "pinned_second": _identity(lora["second"])}
    plan = [
        {"model": lora["base"], "load_format": "auto", "steps": list(auto.values())},
        {
            "model": lora["base"],
            "load_format": "manifest_cache",
            "extra": {"adapter_identities": pins},
            "steps": list(ours.values()),
        },
    ]
    proc = subprocess.run(
        [sys.executable, str(HERE / "run_lora.py"), json.dumps(plan)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = (proc.stdout + proc.stderr).splitlines()
    results = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("CKPTPUB_RESULT ")]
    log = "\n".join(line for line in lines if not line.startswith("CKPTPUB_RESULT "))  # vLLM's and ours
    Path(lora["evicted"]).with_name("offline.log").write_text(log)  # kept for reading after a failure
    assert len(results) == len(auto) + len(ours), f"runner failed (rc {proc.returncode}):\n{log[-6000:]}"
    return (
        dict(zip(auto, results[: len(auto)], strict=True)),
        dict(zip(ours, results[len(auto) :], strict=True)),
        log,
    )


def _refusal(result: dict, folder: str) -> str:
    """The one-line refusal the offline call raised for the adapter at ``folder``."""
    error = result.get("error", "")
    assert result.get("type") == "RefusedError", result
    assert error.startswith(f"ckptpub: refusing to serve adapter {folder}: "), error
    return error


def test_a_verified_adapter_gives_the_tokens_of_auto(offline, lora):
    auto, ours, log = offline
    assert ours["good"]["tokens"] == auto["good"]["tokens"]
    assert ours["good"]["tokens"] != ours["base"]["tokens"], "the adapter must change the answers"
    assert ours["base"]["tokens"] == auto["base"]["tokens"]
    assert ours["second"]["tokens"] == auto["second"]["tokens"] != ours["good"]["tokens"]
    # Identity in the log, once, with the base's; the good adapter was pinned by its path and matched.
    served = (
        f"ckptpub: serving adapter 'good' from {lora['good']}, identity {_identity(lora['good'])}, "
        "verified 8 tensors"
    )
    assert log.count(served) == 1, log[-3000:]
    assert f"base identity {_identity(lora['base'])}" in log.split(served, 1)[1].splitlines()[0]


def test_auto_engines_load_adapters_as_vllm_does(offline):
    auto, _, log = offline
    assert "tokens" in auto["tampered"], auto["tampered"]  # no check at all without manifest_cache


def test_a_flipped_bit_deep_in_lora_b_is_refused_by_tensor_name(offline, lora):
    _, ours, log = offline
    error = _refusal(ours["tampered"], lora["tampered"])
    assert f"tensor '{TAMPERED_LORA_B}' differs from the manifest" in error
    assert log.count(error.split("; ")[0]) >= 1  # logged in the worker, in its own words


def test_an_edited_adapter_config_is_refused(offline, lora):
    _, ours, log = offline
    error = _refusal(ours["config"], lora["config"])
    assert "adapter_config.json: bytes differ from the manifest" in error
    assert log.count(f"ckptpub: refusing to serve adapter {lora['config']}") == 1  # logged once


def test_an_adapter_trained_on_another_base_is_refused_with_both_identities(offline, lora):
    _, ours, _ = offline
    error = _refusal(ours["wrong_base"], lora["wrong_base"])
    assert f"trained on base {_identity(lora['other_base'])}" in error
    assert f"this engine serves base {_identity(lora['base'])}" in error
    assert "adapter_base_check" in error


def test_an_adapter_without_a_manifest_is_refused_with_the_publish_hint(offline, lora):
    _, ours, _ = offline
    error = _refusal(ours["nomanifest"], lora["nomanifest"])
    assert "no ckptpub.json" in error
    assert f"`ckptpub publish {lora['nomanifest']} --base {lora['base']}`" in error
    assert "adapter_require_manifest" in error


def test_an_adapter_without_a_recorded_base_is_served_with_one_warning(offline, lora):
    _, ours, log = offline
    assert ours["nobase"]["tokens"] == ours["good"]["tokens"]
    assert log.count(f"adapter {lora['nobase']} (identity {_identity(lora['nobase'])}) records no base") == 1


def test_a_pin_by_name_is_checked(offline, lora):
    _, ours, _ = offline
    error = _refusal(ours["pinned"], lora["second"])
    assert f"its identity {_identity(lora['second'])} is not the expected {_identity(lora['good'])}" in error


def test_every_path_to_a_folder_pinned_by_path_meets_its_pin(offline, lora):
    _, ours, _ = offline
    expected = f"its identity {_identity(lora['second'])} is not the expected {_identity(lora['good'])}"
    for case in ("by_path_link", "by_path_parent_link"):
        assert expected in _refusal(ours[case], lora["by_path"]), case  # named by its resolved folder


def test_a_held_lora_id_answers_only_for_its_own_folder_and_pins(offline, lora):
    _, ours, _ = offline
    error = _refusal(ours["id_held_other_folder"], lora["second"])
    assert f"LoRA id {IDS['good']} already holds adapter 'good' from {lora['good']}" in error
    assert (
        ours["id_held_spelt_otherwise"]["tokens"] == ours["good"]["tokens"]
    )  # the same folder, spelt otherwise
    error = _refusal(ours["id_held_pinned_name"], lora["good"])
    assert (
        f"holds it with identity {_identity(lora['good'])}, not the expected {_identity(lora['second'])}"
        in (error)
    )


def test_a_failed_activation_leaves_nothing_that_answers(offline, lora):
    """vLLM registers the adapter, then fails copying rank-16 tensors into a rank-8 slot."""
    _, ours, log = offline
    for case in ("rank_lie", "rank_lie_again"):
        result = ours[case]
        assert result.get("type") == "RefusedError", (case, result)
        assert f"ckptpub: cannot load adapter rank_lie ({lora['rank_lie']}): " in result["error"], result
    for case in ("add_rank_lie", "add_rank_lie_again"):  # add_lora fails each time, with vLLM's error
        assert "must match the size of tensor" in ours[case].get("error", ""), (case, ours[case])
    assert ours["good_after_rank_lie"]["tokens"] == ours["good"]["tokens"]
    assert "EngineDeadError" not in log


def test_an_evicted_adapter_is_checked_again_when_read_again(offline, lora):
    _, ours, _ = offline
    good = ours["good"]["tokens"]
    assert ours["evicted_first"]["tokens"] == good
    assert ours["second"]["tokens"] != good  # max_cpu_loras = 1: reading second evicted it
    error = _refusal(ours["evicted_tampered"], lora["evicted"])
    assert f"tensor '{TAMPERED_LORA_B}' differs from the manifest" in error
    assert ours["evicted_restored"]["tokens"] == good


def test_refusals_cost_the_request_only(offline, lora):
    auto, ours, log = offline
    error = ours["add_tampered"]["error"]  # an explicit add_lora fails that call, with the worker's line
    assert f"ckptpub: refusing to serve adapter {lora['tampered']}: tensor '{TAMPERED_LORA_B}'" in error
    assert ours["second_after"]["tokens"] == auto["second"]["tokens"]
    assert ours["base_after"]["tokens"] == auto["base"]["tokens"]
    assert "EngineDeadError" not in log


# -- the OpenAI server ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(lora, offline, tmp_path_factory):
    """``python -m vllm.entrypoints.openai.api_server`` with ``--lora-modules`` and runtime loading.

    It opts out of the manifest requirement, so an adapter without one is served
    unverified (with a warning); every other check stays on. ``by_path`` is pinned by its path.
    """
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    extra = {
        "adapter_require_manifest": False,
        "adapter_identities": {lora["by_path"]: _identity(lora["good"])},
    }
    args = [
        "--model", lora["base"], "--load-format", "manifest_cache",
        "--model-loader-extra-config", json.dumps(extra),
        "--enable-lora", "--max-lora-rank", "8", "--lora-modules", f"good={lora['good']}",
    ]  # fmt: skip
    with api_server(args, log_path, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}) as url:
        yield url, log_path


def _load(url: str, name: str, path: str) -> tuple[int, dict | str]:
    return post(f"{url}/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})


def test_the_server_serves_a_verified_adapter_and_refuses_a_bad_one_per_call(server, offline, lora):
    url, log_path = server
    auto, _, _ = offline
    assert completion_tokens(complete(url, "good")) == auto["good"]["tokens"]
    expected = {
        "tampered": f"tensor '{TAMPERED_LORA_B}' differs from the manifest",
        "wrong_base": f"it was trained on base {_identity(lora['other_base'])}, but this engine serves base "
        f"{_identity(lora['base'])}",
    }
    for name, reason in expected.items():
        status, body = _load(url, name, lora[name])
        assert status == 500, (status, body)
        # vLLM writes "<path>" for paths in what a client sees; the server's log has the whole line.
        assert f"ckptpub: refusing to serve adapter <path>: {reason}" in body["error"]["message"], body
        assert f"ckptpub: refusing to serve adapter {lora[name]}: {reason}" in log_path.read_text()
    # Opted out of the manifest requirement: served unverified, with a warning naming it.
    assert _load(url, "nomanifest", lora["nomanifest"])[0] == 200
    assert completion_tokens(complete(url, "nomanifest")) == auto["good"]["tokens"]
    assert f"adapter {lora['nomanifest']} has no ckptpub.json and adapter_require_manifest is false" in (
        log_path.read_text()
    )
    assert completion_tokens(complete(url, lora["base"])) == auto["base"]["tokens"]


def test_the_server_refuses_a_request_whose_evicted_adapter_changed_then_answers_on(server, offline, lora):
    url, log_path = server
    auto, _, _ = offline
    evictable = shutil.copytree(lora["good"], str(log_path.parent / "evictable"))
    assert _load(url, "evictable", evictable)[0] == 200
    assert completion_tokens(complete(url, "evictable")) == auto["good"]["tokens"]
    assert _load(url, "second", lora["second"])[0] == 200  # max_cpu_loras = 1: this evicts "evictable"
    assert completion_tokens(complete(url, "second")) == auto["second"]["tokens"]
    flip_bit(os.path.join(evictable, "adapter_model.safetensors"), TAMPERED_LORA_B)
    status, body = complete(url, "evictable")  # read again at admission, checked again
    assert status == 500, (status, body)
    reason = f"tensor '{TAMPERED_LORA_B}' differs from the manifest"
    assert f"ckptpub: refusing to serve adapter <path>: {reason}" in body["error"]["message"], body
    assert f"ckptpub: refusing to serve adapter {evictable}: {reason}" in log_path.read_text()
    assert completion_tokens(complete(url, "second")) == auto["second"]["tokens"]
    assert completion_tokens(complete(url, lora["base"])) == auto["base"]["tokens"]
    assert completion_tokens(complete(url, "good")) == auto["good"]["tokens"]


def test_the_server_shows_each_served_adapters_identity_and_its_base(server, lora):
    """/v1/models and /metrics name the base's identity and each adapter's, with the base it applies on."""
    url, _ = server
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as response:
        cards = {card["id"]: card for card in json.loads(response.read())["data"]}
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        metrics = [m for m in response.read().decode().splitlines() if m.startswith("ckptpub:served_info{")]
    base, good = _identity(lora["base"]), _identity(lora["good"])
    assert cards["good"]["ckptpub"] == {"identity": good, "kind": "adapter", "base_identity": base}
    (model,) = [card for card in cards.values() if card.get("parent") is None]
    assert model["ckptpub"] == {"identity": base, "kind": "model", "base_identity": None}
    assert any(f'identity="{good}"' in m and 'kind="adapter"' in m and 'name="good"' in m for m in metrics), (
        metrics
    )
    assert any(f'identity="{base}"' in m and 'kind="model"' in m for m in metrics), metrics


def _shown(url: str) -> tuple[dict[str, dict], dict[str, str]]:
    """The ``ckptpub`` field of each adapter card, and the identity ``/metrics`` shows, by name."""
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as response:
        cards = {c["id"]: c["ckptpub"] for c in json.loads(response.read())["data"] if c.get("parent")}
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        lines = [m for m in response.read().decode().splitlines() if 'kind="adapter"' in m]
    metrics = {}
    for line in lines:
        labels = dict(part.split("=", 1) for part in line.split("{", 1)[1].rsplit("}", 1)[0].split(","))
        metrics[json.loads(labels["name"])] = json.loads(labels["identity"])
    return cards, metrics


def test_the_server_shows_what_each_name_serves_after_a_re_read_and_refuses_a_pin_by_another_path(
    server, offline, lora
):
    """The record is the latest load of each name in the workers (issue 34, A3), and a pin by path
    meets the runtime load through a symlink (A1)."""
    url, log_path = server
    auto, _, _ = offline
    good, second = _identity(lora["good"]), _identity(lora["second"])
    status, body = _load(url, "linked", lora["link"])
    assert status == 500, (status, body)
    assert f"its identity {second} is not the expected {good}" in body["error"]["message"], body
    folder = shutil.copytree(lora["good"], str(log_path.parent / "republished"))
    assert _load(url, "first", folder)[0] == 200
    assert completion_tokens(complete(url, "first")) == auto["good"]["tokens"]
    assert _shown(url)[0]["first"]["identity"] == good
    assert _load(url, "evictor", lora["second"])[0] == 200  # max_cpu_loras = 1: this evicts "first"
    for name in ("adapter_model.safetensors", "adapter_config.json", ckptpub.MANIFEST_NAME):
        shutil.copy(os.path.join(lora["second"], name), os.path.join(folder, name))  # published again
    assert _load(url, "again", folder)[0] == 200  # a second name for the folder: its own record
    cards, metrics = _shown(url)
    assert cards["again"] == {"identity": second, "kind": "adapter", "base_identity": _identity(lora["base"])}
    assert metrics["again"] == second
    assert completion_tokens(complete(url, "first")) == auto["second"]["tokens"]  # read again: the new one
    cards, metrics = _shown(url)
    assert cards["first"]["identity"] == metrics["first"] == second  # shown as served
    assert cards["good"]["identity"] == metrics["good"] == good
    for name in ("adapter_model.safetensors", "adapter_config.json", ckptpub.MANIFEST_NAME):
        shutil.copy(os.path.join(lora["good"], name), os.path.join(folder, name))  # and back
    answer = post(
        f"{url}/v1/load_lora_adapter", {"lora_name": "again", "lora_path": folder, "load_inplace": True}
    )
    assert answer[0] == 200, answer
    cards, metrics = _shown(url)
    assert cards["again"]["identity"] == metrics["again"] == good  # reloaded in place: its new load
    assert completion_tokens(complete(url, "again")) == auto["good"]["tokens"]
