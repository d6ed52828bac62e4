"""Another step's manifest (and shard) swapped in between a process's key and its load (issue 26, item 1).

For the two processes that load, the weight-cache daemon and the engine, the same
functions they run (no engine; ``tests/vllm/test_daemon_takeover.py`` swaps under vLLM's
real daemon): the one read of ``ckptpub.json`` (``daemon.keyed_manifest``,
``startup.check_before_start``), the key computed while that manifest is in force
(``key.checked``), then the load streaming every tensor against the manifest in force
(what ``ManifestCacheLoader.load_weights`` takes from ``key.checked_for``). Whatever is
swapped, the key names the manifest read, and what loads is exactly that identity or
a refusal, never the other step.
"""

from __future__ import annotations

import os
import shutil
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from ckptpub_vllm.daemon import keyed_manifest  # noqa: E402
from ckptpub_vllm.shared.key import checked, checked_for, checkpoint_key  # noqa: E402
from ckptpub_vllm.shared.options import Options  # noqa: E402
from ckptpub_vllm.shared.startup import check_before_start  # noqa: E402
from support.checkpoints import model_tensors, write_checkpoint  # noqa: E402

import ckptpub  # noqa: E402
from ckptpub.serving import RefusedError  # noqa: E402
from tests.hostile.test_corpus_loader import verify_as_vllm_streams  # noqa: E402

SHARD, MANIFEST = "model.safetensors", ckptpub.MANIFEST_NAME


def _put(source, folder, names) -> None:
    for name in names:
        shutil.copyfile(os.path.join(source, name), os.path.join(folder, f".{name}.swap"))
        os.replace(os.path.join(folder, f".{name}.swap"), os.path.join(folder, name))


#: (what is swapped in after the key, and put back before the load or not; the outcome)
SWAPS = {
    "other step's manifest and shard": ([MANIFEST, SHARD], False, "refused"),
    "other step's manifest only": ([MANIFEST], False, "served"),
    "other step's manifest and shard, swapped back": ([MANIFEST, SHARD], True, "served"),
}


def _read_once(entry: str, folder: str) -> ckptpub.Manifest | None:
    if entry == "daemon":
        config = SimpleNamespace(
            load_config=SimpleNamespace(load_format="manifest_cache", model_loader_extra_config={})
        )
        return keyed_manifest(config, folder)
    return check_before_start(folder, Options())


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    root = tmp_path_factory.mktemp("swaps")
    a = write_checkpoint(root / "a", extra_files=False)
    tensors = model_tensors()
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 0  # same header, other bytes
    b = write_checkpoint(root / "b", tensors, extra_files=False)
    return {"a": a, "ia": ckptpub.publish(a).identity, "b": b, "ib": ckptpub.publish(b).identity}


@pytest.mark.parametrize("entry", ["daemon", "engine"])
@pytest.mark.parametrize("swap", list(SWAPS), ids=list(SWAPS))
def test_a_process_loads_the_identity_it_was_keyed_by_or_refuses(tmp_path, steps, entry, swap):
    names, back, expected = SWAPS[swap]
    folder = str(shutil.copytree(steps["a"], tmp_path / "current"))
    manifest = _read_once(entry, folder)
    with checked(folder, manifest):
        key = checkpoint_key(folder)  # WeightCacheDaemon.__init__ / IpcModelLoader._fetch_entries
        _put(steps["b"], folder, names)
        if back:
            _put(steps["a"], folder, names)
        loaded = checked_for(folder)
        assert loaded is not None
        refusal = ""
        try:
            verify_as_vllm_streams(folder, loaded.manifest)  # load_weights / the disk path
        except RefusedError as error:
            refusal = str(error)
    assert key == steps["ia"] == loaded.manifest.identity
    assert ("refused" if refusal else "served") == expected
    assert not refusal or "tensor 'model.norm.weight' differs" in refusal
    assert checkpoint_key(folder) == ckptpub.read_manifest(folder).identity  # outside: read as usual


@pytest.mark.parametrize("entry", ["daemon", "engine"])
def test_a_hub_id_whose_ref_moves_loads_the_snapshot_it_was_keyed_by(tmp_path, steps, entry, monkeypatch):
    """A hub id is resolved once: its ref moved to another published commit between the key and the load,
    the load still takes the snapshot (and manifest) the key was computed from, and verifies there."""
    from ckptpub_vllm.daemon import manifest_folder
    from huggingface_hub import constants
    from support.hf_cache import cache_dir, cache_model

    from ckptpub.serving import model_folder

    monkeypatch.setattr(constants, "HF_HUB_CACHE", cache_dir(tmp_path))  # as HF_HOME would at import
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    def cached_commit(step: str) -> str:
        unpublished = shutil.ignore_patterns(MANIFEST)
        files = shutil.copytree(steps[step], tmp_path / f"files-{step}", ignore=unpublished)
        snapshot = cache_model(tmp_path, "acme/moving", files)
        assert ckptpub.publish(snapshot).identity == steps[f"i{step}"]
        return snapshot

    first = cached_commit("a")
    if entry == "daemon":
        config = SimpleNamespace(
            load_config=SimpleNamespace(load_format="manifest_cache", model_loader_extra_config={})
        )
        folder = manifest_folder(config, "acme/moving", None)
        manifest = keyed_manifest(config, folder)
    else:  # ManifestCacheLoader._prepare
        folder = model_folder("acme/moving")
        manifest = check_before_start(folder, Options())
    assert folder == first
    with checked("acme/moving", manifest, folder):
        key = checkpoint_key("acme/moving")
        assert cached_commit("b") != first  # refs/main now names the other step's commit
        loaded = checked_for("acme/moving")
        assert loaded is not None
        verify_as_vllm_streams(loaded.folder, loaded.manifest)  # load_weights / the disk path
    assert key == loaded.manifest.identity == steps["ia"]
    assert loaded.folder == first
    assert checkpoint_key("acme/moving") == steps["ib"]  # outside: resolved and read as usual


@pytest.mark.parametrize("load_format", ["auto", "runai_streamer"])
def test_a_manifest_that_appears_after_the_daemons_format_check_is_refused(tmp_path, steps, load_format):
    """A daemon of a folder without a manifest keeps its (unverifying) load format; a manifest published
    between that check and the daemon's one read would key it by an identity it never verifies."""
    from ckptpub_vllm.daemon import manifest_folder

    folder = str(shutil.copytree(steps["a"], tmp_path / "current", ignore=shutil.ignore_patterns(MANIFEST)))
    config = SimpleNamespace(
        load_config=SimpleNamespace(load_format=load_format, model_loader_extra_config={})
    )
    assert manifest_folder(config, folder, None) == folder  # no manifest: the format is left as asked
    assert config.load_config.load_format == load_format
    assert keyed_manifest(config, folder) is None  # still none: an unpublished folder, keyed as vLLM keys it
    ckptpub.publish(folder)  # published meanwhile
    with pytest.raises(
        RefusedError,
        match=f"ckptpub.json appeared while the daemon started, and its load "
        f"format '{load_format}' does not verify",
    ):
        keyed_manifest(config, folder)
