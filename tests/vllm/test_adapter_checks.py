"""The adapter checks one by one, with vLLM's own adapter loaders and no engine.

``load_checked`` is given what vLLM's ``WorkerLoRAManager._load_adapter`` runs
(``PEFTHelper.from_local_dir``, then ``LoRAModel.from_local_checkpoint``), real
vLLM code on real PEFT adapters; only the engine around it is left out (that path
is ``test_lora.py``). Every case here takes milliseconds.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch
from ckptpub_vllm.frontend.adapters import RefusalReason, raise_refusals
from ckptpub_vllm.shared.options import split_extra_config
from ckptpub_vllm.worker import adapters
from support.checkpoints import with_retired_manifest

import ckptpub
from ckptpub.serving import RefusedError
from tests.vllm.lora_helpers import TAMPERED_LORA_B, flip_bit, publish

WEIGHTS = "adapter_model.safetensors"


def _base(lora_folders, identity: str | None = "base", **extra) -> adapters.ServedBase:
    if identity == "base":
        identity = ckptpub.read_manifest(lora_folders["base"]).identity
    return adapters.ServedBase(lora_folders["base"], identity, split_extra_config(extra)[0])


def _vllm_load(request):
    """What ``WorkerLoRAManager._load_adapter`` does with the files (vLLM's functions, as it calls them)."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    helper = PEFTHelper.from_local_dir(request.lora_path, 512)
    return LoRAModel.from_local_checkpoint(
        request.lora_path, {"q_proj", "v_proj"}, helper, lora_model_id=request.lora_int_id, device="cpu"
    )


def _request(name: str, path: str):
    from vllm.lora.request import LoRARequest

    return LoRARequest(name, 1, path)


@pytest.fixture(scope="module", autouse=True)
def _vllm_reads_routed():
    """Route vLLM's adapter reads through ckptpub in this process, as ``serve_base`` does in a worker."""
    adapters.install()


def _lora_b(lora, module: str = "model.layers.1.self_attn.v_proj") -> torch.Tensor:
    return lora.get_lora(module).lora_b


def _file_lora_b(folder: str) -> torch.Tensor:
    return safetensors.torch.load_file(os.path.join(folder, WEIGHTS))[TAMPERED_LORA_B]


def test_vllm_gets_exactly_the_checked_bytes_even_if_the_file_changes_during_the_load(lora_folders, tmp_path):
    """A writer that lands after the check, while vLLM loads, changes nothing vLLM reads."""
    folder = shutil.copytree(lora_folders["good"], str(tmp_path / "good"))
    published = _file_lora_b(folder).clone()

    def load_while_a_writer_lands(request):
        flip_bit(os.path.join(folder, WEIGHTS), TAMPERED_LORA_B)
        with open(os.path.join(folder, "adapter_config.json"), "r+b") as f:
            f.write(b"garbage")
        return _vllm_load(request)

    lora = adapters.load_checked(_request("good", folder), _base(lora_folders), load_while_a_writer_lands)
    assert not torch.equal(_file_lora_b(folder), published)  # the file did change...
    assert torch.equal(_lora_b(lora), published)  # ...vLLM got the checked bytes
    served = adapters.record_of(lora)  # what the worker records once vLLM added it
    assert (served.name, served.path, served.requested) == ("good", folder, folder)
    assert served.identity == ckptpub.read_manifest(lora_folders["good"]).identity
    assert served.base_identity == ckptpub.read_manifest(lora_folders["base"]).identity


def test_an_adapter_vllm_holds_keeps_its_bytes_and_one_it_dropped_leaves_its_memory_to_the_next(lora_folders):
    """Adapters are read into memory a dropped adapter left (``adapters._weight_buffers``): an
    adapter vLLM still holds (its CPU cache) keeps its checked bytes through later loads of another
    of the same size, and the memory of one it dropped is reused, not allocated again."""
    good, other = lora_folders["good"], lora_folders["second"]
    assert os.path.getsize(os.path.join(good, WEIGHTS)) == os.path.getsize(os.path.join(other, WEIGHTS))
    buffers = adapters._weight_buffers
    held = adapters.load_checked(_request("good", good), _base(lora_folders), _vllm_load)
    allocated, reused = buffers.allocated, buffers.reused
    for _ in range(3):  # each load's adapter is dropped before the next
        adapters.load_checked(_request("second", other), _base(lora_folders), _vllm_load)
    assert torch.equal(_lora_b(held), _file_lora_b(good))  # never overwritten while vLLM held it
    assert (buffers.allocated, buffers.reused) == (allocated + 1, reused + 2)


@pytest.mark.parametrize("chunk", [7, 4096], ids=["7 bytes: the header length in pieces", "4 KiB"])
def test_an_adapter_read_in_small_pieces_is_checked_as_it_arrives(lora_folders, monkeypatch, chunk):
    """The weight file is hashed while it is read: with chunks smaller than the header's length
    field and than each tensor, a good adapter loads with the file's bytes and a changed one is
    refused by name."""
    from ckptpub._serving import engine_files

    monkeypatch.setattr(engine_files, "READ_CHUNK_BYTES", chunk)
    lora = adapters.load_checked(_request("good", lora_folders["good"]), _base(lora_folders), _vllm_load)
    assert torch.equal(_lora_b(lora), _file_lora_b(lora_folders["good"]))
    with pytest.raises(RefusedError, match=f"'{TAMPERED_LORA_B}' differs from the manifest"):
        adapters.load_checked(_request("t", lora_folders["tampered"]), _base(lora_folders), _vllm_load)


def test_a_check_failure_never_reaches_vllm(lora_folders):
    calls = []
    with pytest.raises(RefusedError, match="differs from the manifest") as refused:
        adapters.load_checked(_request("t", lora_folders["tampered"]), _base(lora_folders), calls.append)
    assert calls == []
    assert str(refused.value).startswith(f"ckptpub: refusing to serve adapter {lora_folders['tampered']}: ")


def test_a_missing_folder_is_vllms_not_found(lora_folders, tmp_path):
    from vllm.exceptions import LoRAAdapterNotFoundError

    with pytest.raises(LoRAAdapterNotFoundError):
        adapters.load_checked(_request("gone", str(tmp_path / "gone")), _base(lora_folders), _vllm_load)


def test_opting_out_of_the_base_check_serves_another_bases_adapter_with_a_warning(lora_folders, caplog):
    caplog.set_level(logging.WARNING, logger="vllm.ckptpub")
    base = _base(lora_folders, adapter_base_check=False)
    assert adapters.check_adapter(lora_folders["wrong_base"], "w", base) is not None
    assert "adapter_base_check is false" in caplog.text
    with pytest.raises(RefusedError, match="it was trained on base"):
        adapters.check_adapter(lora_folders["wrong_base"], "w", _base(lora_folders))


def test_a_base_served_without_manifest_cannot_vouch_for_an_adapter(lora_folders, caplog):
    caplog.set_level(logging.WARNING, logger="vllm.ckptpub")
    with pytest.raises(RefusedError, match="this engine serves base unknown"):
        adapters.check_adapter(lora_folders["good"], "g", _base(lora_folders, identity=None))
    assert adapters.check_adapter(lora_folders["nobase"], "n", _base(lora_folders, identity=None))
    assert "records no base identity" in caplog.text


def test_opting_out_of_the_manifest_serves_an_unpublished_adapter_unverified(lora_folders, caplog):
    caplog.set_level(logging.WARNING, logger="vllm.ckptpub")
    base = _base(lora_folders, adapter_require_manifest=False)
    lora = adapters.load_checked(_request("n", lora_folders["nomanifest"]), base, _vllm_load)
    assert torch.equal(_lora_b(lora), _file_lora_b(lora_folders["nomanifest"]))
    assert "has no ckptpub.json and adapter_require_manifest is false: vLLM loads it unverified" in (
        caplog.text
    )
    pin = {"n": "blake3:" + "0" * 64}
    pinned = _base(lora_folders, adapter_require_manifest=False, adapter_identities=pin)
    with pytest.raises(RefusedError, match="the pinned identity blake3:0+ cannot be checked"):
        adapters.check_adapter(lora_folders["nomanifest"], "n", pinned)


def test_verify_false_skips_only_the_bytes(lora_folders, caplog):
    caplog.set_level(logging.WARNING, logger="vllm.ckptpub")
    base = _base(lora_folders, verify=False)
    lora = adapters.load_checked(_request("t", lora_folders["tampered"]), base, _vllm_load)
    assert torch.equal(_lora_b(lora), _file_lora_b(lora_folders["tampered"]))
    assert "WITHOUT verification" in caplog.text
    with pytest.raises(RefusedError, match="it was trained on base"):
        adapters.load_checked(_request("w", lora_folders["wrong_base"]), base, _vllm_load)


def test_an_engine_that_trusts_a_key_serves_only_adapters_that_key_signed(lora_folders, tmp_path):
    from support.signhelpers import make_key

    key = make_key(tmp_path / "keys", "trainer")
    signed = shutil.copytree(lora_folders["good"], str(tmp_path / "signed"))
    ckptpub.publish(signed, sign=key.private, base=lora_folders["base"])
    base = _base(lora_folders, public_key=str(key.public))
    assert adapters.check_adapter(signed, "s", base).identity == ckptpub.read_manifest(signed).identity
    with pytest.raises(RefusedError, match="refusing to serve adapter .*: a signed checkpoint is required"):
        adapters.check_adapter(lora_folders["good"], "g", base)


def test_an_adapter_pinned_by_name_and_by_folder_to_two_identities_is_refused(lora_folders):
    good = lora_folders["good"]
    pins = {"g": ckptpub.read_manifest(good).identity, good: "blake3:" + "1" * 64}
    with pytest.raises(RefusedError, match="pinned to two identities"):
        adapters.check_adapter(good, "g", _base(lora_folders, adapter_identities=pins))


def test_a_pickled_adapter_is_refused_unread(lora_folders, tmp_path):
    folder = shutil.copytree(lora_folders["good"], str(tmp_path / "pickled"))
    os.remove(os.path.join(folder, WEIGHTS))
    with open(os.path.join(folder, "adapter_model.bin"), "wb") as f:
        f.write(b"never unpickled")
    publish(folder, "--allow-no-weights", "--base", lora_folders["base"])
    with pytest.raises(RefusedError, match="adapter_model.bin is a pickle, which ckptpub never loads"):
        adapters.load_checked(_request("p", folder), _base(lora_folders), _vllm_load)


def test_weights_behind_a_symlink_out_of_the_folder_are_refused(lora_folders, tmp_path):
    folder = shutil.copytree(lora_folders["good"], str(tmp_path / "linked"))
    outside = shutil.copy(os.path.join(folder, WEIGHTS), str(tmp_path / "outside.safetensors"))
    os.remove(os.path.join(folder, WEIGHTS))
    os.symlink(outside, os.path.join(folder, WEIGHTS))
    with pytest.raises(RefusedError, match=f"{WEIGHTS}: symlink points outside the checkpoint folder"):
        adapters.load_checked(_request("l", folder), _base(lora_folders), _vllm_load)


def test_weights_of_another_size_are_refused_before_anything_is_allocated(lora_folders, tmp_path):
    folder = shutil.copytree(lora_folders["good"], str(tmp_path / "grown"))
    with open(os.path.join(folder, WEIGHTS), "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(RefusedError, match=f"{WEIGHTS} has [0-9]+ bytes, the manifest says"):
        adapters.load_checked(_request("g", folder), _base(lora_folders), _vllm_load)


def test_the_offline_call_raises_the_first_refusal_and_counts_the_rest():
    from vllm.outputs import CompletionOutput, RequestOutput

    def output(finish_reason, stop_reason):
        completion = CompletionOutput(
            index=0, text="", token_ids=[], cumulative_logprob=None, logprobs=None,
            finish_reason=finish_reason, stop_reason=stop_reason,
        )  # fmt: skip
        return RequestOutput(
            request_id="0", prompt=None, prompt_token_ids=[1], prompt_logprobs=None,
            outputs=[completion], finished=True,
        )  # fmt: skip

    line = "ckptpub: refusing to serve adapter /a: no ckptpub.json"
    raise_refusals([output("length", None), output("error", "not ours")])
    with pytest.raises(RefusedError) as refused:
        raise_refusals([output("error", line), output("stop", "x"), output("error", line)])
    assert str(refused.value) == line + " (and 1 more requests refused)"
    reason = RefusalReason(line)
    assert reason == "error"
    assert reason.line == line


def test_the_adapter_benchmark_runs_at_toy_size(tmp_path):
    """``benchmarks/bench_lora_load.py`` still runs (its figures are docs/performance.md's, not checked)."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_lora_load.py"
    done = subprocess.run(
        [sys.executable, str(script), "--layers", "1", "--repeat", "1", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = [line.strip("|").split("|") for line in done.stdout.splitlines() if line.startswith("| rank ")]
    assert len(rows) == 2, done.stdout
    assert all(cells[6].strip().endswith("x") for cells in rows), rows  # the ratio of the medians


def test_the_server_shows_each_name_with_the_latest_load_of_its_id_in_every_worker(lora_folders):
    """What ``/v1/models`` and ``/metrics`` show of adapters: asked of the workers each time.

    vLLM's ``OpenAIServingModels`` and engine client need a running engine (``test_lora.py``
    runs the server for real); here they are stand-ins holding real ``LoRARequest``s, and
    the workers' answers are rows as ``worker.adapters`` gives them.
    """
    import asyncio
    import types

    from ckptpub_vllm.frontend import served
    from vllm.lora.request import LoRARequest

    good, second = lora_folders["good"], lora_folders["second"]
    identity = {
        name: ckptpub.read_manifest(lora_folders[name]).identity for name in ("good", "second", "base")
    }
    rows = {  # LoRA id -> the worker's record of its latest load
        1: [1, "a", good, good, identity["good"], identity["base"]],
        2: [2, "b", good, good, identity["second"], identity["base"]],  # b read the folder re-published
        3: [3, "c", second, second, identity["second"], identity["base"]],
        4: [4, "other", second, second, identity["second"], identity["base"]],
    }
    requests = {
        "a": LoRARequest("a", 1, good),
        "b": LoRARequest("b", 2, good),  # another name for the same folder: its own record
        "c": LoRARequest("c", 3, second),
        "d": LoRARequest("d", 4, second),  # id 4 holds another name: nothing to show for d
        "e": LoRARequest("e", 5, second),  # the ranks disagree on id 5
    }
    answers = [[*rows.values(), [5, "e", second, second, identity["second"], None]], [*rows.values()]]

    async def collective_rpc(method):
        assert method == adapters.LOADED_METHOD
        return answers

    config = types.SimpleNamespace(
        load_config=types.SimpleNamespace(load_format="manifest_cache"), lora_config=object()
    )
    engine = types.SimpleNamespace(vllm_config=config, collective_rpc=collective_rpc)
    models = types.SimpleNamespace(engine_client=engine, lora_requests=requests)
    asyncio.run(served.refresh_adapters(models))
    shown = {item.name: item for item in served.served() if item.kind == "adapter"}
    assert {name: item.identity for name, item in shown.items()} == {
        "a": identity["good"],
        "b": identity["second"],
        "c": identity["second"],
        "d": None,
        "e": None,
    }
    assert served.adapter_named("b").card() == {
        "identity": identity["second"],
        "kind": "adapter",
        "base_identity": identity["base"],
    }
    del requests["a"]  # unloaded: no longer shown
    answers[:] = [[*rows.values()]]
    asyncio.run(served.refresh_adapters(models))
    assert served.adapter_named("a") is None

    async def failing(method):
        raise RuntimeError("engine gone")

    engine.collective_rpc = failing  # the workers cannot say: shown with no identity, never a stale one
    asyncio.run(served.refresh_adapters(models))
    assert {item.identity for item in served.served() if item.kind == "adapter"} == {None}


def test_an_adapter_recorded_against_an_older_manifest_is_refused_with_the_command_that_publishes_it(
    lora_folders, tmp_path
):
    """Only ckptpub/3 is read (issue 31). An adapter published before (its own manifest ckptpub/2) is
    refused by its format; one whose manifest records the identity of its base's older manifest (the same
    model, another identity) is refused by its base. Each refusal names `ckptpub publish`; published again
    with --base, it serves."""
    base = _base(lora_folders)
    old = Path(shutil.copytree(lora_folders["good"], tmp_path / "old"))
    with_retired_manifest(old, "ckptpub/2")
    with pytest.raises(RefusedError) as refused:
        adapters.check_adapter(str(old), "old", base)
    line = str(refused.value)
    assert line.startswith(f"ckptpub: refusing to serve adapter {old}: its ckptpub.json is unusable: "), line
    assert "format 'ckptpub/2' is no longer read (ckptpub reads 'ckptpub/3')" in line
    assert f"ckptpub publish {old}" in line
    stale = Path(shutil.copytree(lora_folders["good"], tmp_path / "stale"))
    older_identity = "blake3:" + "2" * 64  # what the base's ckptpub/2 manifest said
    ckptpub.publish(stale, base=older_identity)
    with pytest.raises(RefusedError) as refused:
        adapters.check_adapter(str(stale), "stale", base)
    line = str(refused.value)
    assert f"it was trained on base {older_identity}, but this engine serves base {base.identity}" in line
    assert f"publish the adapter again with `ckptpub publish {stale} --base {lora_folders['base']}`" in line
    assert "\n" not in line
    ckptpub.publish(stale, base=lora_folders["base"])
    assert adapters.check_adapter(str(stale), "stale", base) is not None
