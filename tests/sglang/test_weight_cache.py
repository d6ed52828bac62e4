"""SGLang's weight cache keyed by identity, with SGLang 0.5.23's own code over a real Unix socket.

The engine's side is SGLang's ``IpcModelLoader._fetch_from_cache`` in this process (the
plugin loaded by SGLang's ``load_plugins``), the daemon's is SGLang's
``WeightCacheDaemon.serve``/``_handle_connection`` in ``cpu_daemon.py``, another process.
Simulated, because SGLang takes them from CUDA: the parallel state of one rank
(``one_rank``, on both sides), the device's UUID (the socket path is given) and the model
built on the GPU (the daemon serves the tensors SGLang's disk loader streams, shared as
CPU tensors): see ``cpu_daemon.py``.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.checkpoints import model_tensors, write_checkpoint
from support.hf_cache import cache_dir, cache_model

import ckptpub
from tests.sglang.one_rank import EXEC, PARALLEL, cache_key


def publish_step(run: Path, step: int) -> Path:
    folder = write_checkpoint(run / f"step-{step}", model_tensors(seed=step))
    ckptpub.publish(str(folder))
    return folder


def served_tensors(result: dict[str, Any]) -> dict[str, np.ndarray]:
    from sglang.srt.weight_cache.transport import TorchIpcTransportBackend

    backend = TorchIpcTransportBackend()
    return {name: backend.import_tensor(entry).numpy() for name, entry in result["entries"].items()}


def assert_holds(result: dict[str, Any] | None, step: int) -> None:
    """The daemon served the tensors of ``step`` (imported once: a CPU tensor's shared file opens once)."""
    assert result is not None
    assert result["status"] == "ok"
    served = served_tensors(result)
    expected = model_tensors(seed=step)
    assert sorted(served) == sorted(expected)
    for name, array in expected.items():
        assert np.array_equal(served[name], array), name


def assert_served(result: dict[str, Any] | None, folder: Path) -> None:
    """The daemon served (its key matched), under the identity of ``folder``'s manifest."""
    assert result is not None
    assert result["status"] == "ok"
    assert result["config"]["ckptpub_identity"] == ckptpub.read_manifest(str(folder)).identity


@pytest.fixture
def run(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    return folder


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's parallel state: one rank's, simulated (``one_rank.PARALLEL``)."""
    from sglang.srt.weight_cache import ipc_loader

    monkeypatch.setattr(ipc_loader, "get_parallel", lambda: PARALLEL)
    monkeypatch.setattr(ipc_loader, "get_exec", lambda: EXEC)


def fetch(model: Path | str, socket_path: str) -> dict[str, Any] | None:
    """SGLang's engine-side request (``IpcModelLoader._fetch_from_cache``, the plugin's hooks around it) for
    ``model`` as SGLang's ``ModelConfig`` names it."""
    from sglang.srt.weight_cache.ipc_loader import IpcModelLoader

    loader = IpcModelLoader(_load_config(), socket_path=socket_path, weight_cache_mode="client")
    result: dict[str, Any] | None = loader._fetch_from_cache(_model_config(Path(model)), None)
    return result


def test_a_moved_latest_link_and_a_resave_in_place_are_refused_the_same_folder_by_any_path_served(
    run: Path, start_daemon: Any, one_rank: None
) -> None:
    publish_step(run, 1000)
    publish_step(run, 1200)
    (run / "latest").symlink_to("step-1000")
    socket_path = start_daemon(run / "latest")

    assert_holds(fetch(run / "latest", socket_path), 1000)
    assert_served(fetch(run / "step-1000", socket_path), run / "step-1000")  # the same folder by its path
    assert_served(fetch(run / ".." / "run" / "step-1000", socket_path), run / "step-1000")  # by an alias
    shutil.copytree(run / "step-1000", run / "copy")
    assert_served(fetch(run / "copy", socket_path), run / "step-1000")  # a copy of the published folder

    (run / "latest").unlink()
    (run / "latest").symlink_to("step-1200")  # training moved on after the daemon loaded
    with pytest.raises(RuntimeError, match="Daemon config mismatch"):
        fetch(run / "latest", socket_path)

    write_checkpoint(run / "step-1000", model_tensors(seed=7))  # step 1000 saved again, in place
    ckptpub.publish(str(run / "step-1000"))
    with pytest.raises(RuntimeError, match="Daemon config mismatch"):
        fetch(run / "step-1000", socket_path)


def test_a_folder_without_a_manifest_is_not_served_from_the_daemon(
    tmp_path: Path, start_daemon: Any, one_rank: None
) -> None:
    from sglang.srt.weight_cache.ipc_loader import IpcModelLoader

    plain = write_checkpoint(tmp_path / "plain")
    socket_path = start_daemon(plain)
    assert fetch(plain, socket_path) is None  # the engine does not ask: SGLang loads from disk (client mode)
    sglang_fetch = IpcModelLoader._fetch_from_cache.__wrapped__  # SGLang's request, without the plugin's hook
    loader = IpcModelLoader(_load_config(), socket_path=socket_path, weight_cache_mode="client")
    with pytest.raises(RuntimeError, match="Daemon config mismatch"):  # its key matches no other, by design
        sglang_fetch(loader, _model_config(plain), None)


def test_required_manifest_refuses_the_engine_before_it_asks(
    tmp_path: Path, one_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptpub.serving import RefusedError

    plain = write_checkpoint(tmp_path / "plain")
    monkeypatch.setenv("CKPTPUB_REQUIRE_MANIFEST", "1")
    with pytest.raises(RefusedError, match=r"refusing to serve .*plain: no ckptpub\.json"):
        fetch(plain, str(tmp_path / "absent.sock"))


def test_a_daemon_and_an_engine_of_which_one_has_the_plugin_fail_closed(
    run: Path, start_daemon: Any, one_rank: None
) -> None:
    from sglang.srt.weight_cache import protocol

    published = publish_step(run, 1000)
    unplugged = start_daemon(published, env={"SGLANG_PLUGINS": "none"})  # SGLang loads no plugin there
    with pytest.raises(RuntimeError, match="Error communicating with daemon"):
        fetch(published, unplugged)  # that daemon cannot decode a key with ckptpub_identity

    plugged = start_daemon(published)
    base = protocol.CacheConfig.__mro__[1]  # SGLang's own CacheConfig, as an engine without the plugin has it
    key = cache_key(base, str(published), _model_config(published))  # SGLang's key: the path as given
    with socket.socket(socket.AF_UNIX) as connection:
        connection.connect(plugged)
        protocol.send_msg(connection, {"type": "fetch_state", "config": key.to_dict()})
        with pytest.raises(ConnectionError):  # the daemon refuses a key without ckptpub_identity
            protocol.recv_msg(connection)


def test_a_hub_id_is_keyed_by_the_snapshot_its_branch_names(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang keeps a hub id as given; the key follows ``refs/main`` to its snapshot's manifest (offline)."""
    import huggingface_hub.constants
    from sglang.srt.weight_cache import protocol

    home = tmp_path / "hf"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", cache_dir(home))
    # each commit published in the cache, as `ckptpub publish ID --revision REV` does
    first = cache_model(home, "acme/tiny", write_checkpoint(run / "1000", model_tensors(1000)))
    ckptpub.publish(first)
    before = cache_key(protocol.CacheConfig, "acme/tiny", _model_config(Path(first)))
    second = cache_model(home, "acme/tiny", write_checkpoint(run / "1200", model_tensors(1200)))  # main moves
    ckptpub.publish(second)
    after = cache_key(protocol.CacheConfig, "acme/tiny", _model_config(Path(first)))
    assert before.ckptpub_identity == ckptpub.read_manifest(first).identity
    assert after.ckptpub_identity == ckptpub.read_manifest(second).identity
    assert not before.matches(after)


def _load_config() -> Any:
    from sglang.srt.configs.load_config import LoadConfig

    return LoadConfig()


def _model_config(model: Path) -> Any:
    from sglang.srt.configs.model_config import ModelConfig

    return ModelConfig(model_path=str(model))
