"""Filesystem requests of an engine start, counted by a real FUSE mount (``tests/support/slowfs.py``).

On a network filesystem every request is a round trip, so what ckptpub adds to an
engine start must not grow with the number of shards. Python's audit hooks cannot
check that: safetensors opens and maps shards from Rust. The kernel sees every
request, so these tests serve real checkpoints from a FUSE pass-through mount that
counts requests per file (1 ms latency each, to keep the tests quick; no attribute
cache, so every ``stat`` is counted). Nothing is mocked: real files, the plugin's own
start work, real vLLM CPU engines. No time is asserted; the benchmark
``benchmarks/bench_engine_start.py`` measures seconds.

They skip, giving the reason, only where FUSE cannot mount (no ``/dev/fuse``, no
``fusermount3``, no ``mfusepy``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support.slowfs import FuseUnavailableError, SlowFS
from support.vllm_engine_helpers import run_engines

import ckptpub

FEW_SHARDS = "400KB"  # max_shard_size giving 5 shards of the tiny Qwen3
MANY_SHARDS = "1KB"  # one tensor (or a few norms) a shard: 22 shards


def is_shard(path: str) -> bool:
    return path.endswith(".safetensors")


@pytest.fixture(scope="module")
def slow_mount(tmp_path_factory):
    """``few`` and ``many`` (one model, two layouts), ``for_auto`` and ``for_manifest`` (copies of
    ``few``), all published, served from a slow mount; yields ``(fs, mountpoint)``."""
    from support.tiny_model import build_tiny_qwen3

    root = tmp_path_factory.mktemp("slowfs")
    source = root / "source"
    for name, shard_size in (("few", FEW_SHARDS), ("many", MANY_SHARDS)):
        ckptpub.publish(build_tiny_qwen3(str(source / name), max_shard_size=shard_size))
    for copy in ("for_auto", "for_manifest"):
        shutil.copytree(source / "few", source / copy)
    with mounted(SlowFS(str(source), str(root / "mnt"), latency_s=0.001)) as fs:
        yield fs, str(root / "mnt")


def mounted(fs: SlowFS) -> SlowFS:
    """``fs``, mounted; the test skips, saying why, where FUSE cannot mount."""
    try:
        fs.start()
    except FuseUnavailableError as e:
        pytest.skip(f"FUSE cannot mount here: {e}")
    return fs


class BlockFailedError(Exception):
    """Raised inside a mount's block; carries the file left open there and the requests counted."""


def read_then_fail(fs: SlowFS, mnt: Path) -> None:
    """Read ``a.bin`` through the mount, then fail inside the block with the file still open."""
    with fs:
        fs.reset()
        held = open(mnt / "a.bin", "rb")  # noqa: SIM115  (still open when the block fails: the mount is busy)
        assert held.read() == b"x" * 100
        assert os.listdir(mnt) == ["a.bin"]
        raise BlockFailedError(held, fs.requests())


def test_the_mount_counts_each_request_and_unmounts_when_the_block_fails(tmp_path):
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "a.bin").write_bytes(b"x" * 100)
    mnt = tmp_path / "mnt"
    with pytest.raises(BlockFailedError) as failed:
        read_then_fail(mounted(SlowFS(str(tmp_path / "source"), str(mnt), latency_s=0.001)), mnt)
    held, requests = failed.value.args
    held.close()
    assert not os.path.ismount(mnt)
    assert requests.by_path["/a.bin"]["open"] == 1
    assert requests.by_path["/a.bin"]["read"] >= 1
    assert requests.by_path["/"]["readdir"] >= 1


def daemon_path_start(fs: SlowFS, folder: str):
    """ckptpub's whole engine-start work when weights come from a daemon; returns (key, requests).

    In the loader's order: the start-time checks, then vLLM's key while the loader
    hands it the manifest it checked (``ManifestCacheLoader._load_model``).
    """
    from ckptpub_vllm.shared.key import checked, checkpoint_key
    from ckptpub_vllm.shared.options import Options
    from ckptpub_vllm.shared.startup import check_before_start

    fs.reset()
    manifest = check_before_start(folder, Options())
    with checked(folder, manifest):
        key = checkpoint_key(folder)
    return key, fs.requests()


@pytest.mark.parametrize("layout", ["few", "many"])
def test_daemon_path_start_makes_no_request_on_any_shard(slow_mount, layout):
    fs, mnt = slow_mount
    folder = os.path.join(mnt, layout)
    key, requests = daemon_path_start(fs, folder)

    assert key == ckptpub.read_manifest(folder).identity
    # The counting works: the manifest and the config were read through the mount.
    for small in (ckptpub.MANIFEST_NAME, "config.json"):
        assert requests.by_path.get(f"/{layout}/{small}", {}).get("read", 0) >= 1, requests.by_path
    on_shards = {path: kinds for path, kinds in requests.by_path.items() if is_shard(path)}
    assert on_shards == {}, f"ckptpub's daemon-path start touched shard files: {on_shards}"


def test_daemon_path_start_requests_do_not_grow_with_shards(slow_mount):
    fs, mnt = slow_mount
    few, many = (os.path.join(mnt, name) for name in ("few", "many"))
    assert len(ckptpub.read_manifest(few).weights) == 5
    assert len(ckptpub.read_manifest(many).weights) == 22

    _, few_requests = daemon_path_start(fs, few)
    _, many_requests = daemon_path_start(fs, many)
    assert few_requests.count() > 0
    assert many_requests.by_kind() == few_requests.by_kind()


@pytest.mark.slow
def test_verified_disk_load_opens_each_shard_no_more_than_auto(slow_mount):
    fs, mnt = slow_mount
    fs.reset()
    jobs = [
        {"model": os.path.join(mnt, "for_auto"), "load_format": "auto"},
        {"model": os.path.join(mnt, "for_manifest"), "load_format": "manifest_cache"},
    ]
    (auto, ours), log = run_engines(jobs)
    requests = fs.requests()

    assert "tokens" in auto, (auto, log[-3000:])
    assert "tokens" in ours, (ours, log[-3000:])
    assert ours["tokens"] == auto["tokens"]
    assert "ckptpub: loaded and verified 25 of 25 tensors" in log
    shards = ckptpub.read_manifest(os.path.join(mnt, "few")).weights
    for shard in shards:
        auto_opens = requests.by_path.get(f"/for_auto/{shard}", {}).get("open", 0)
        our_opens = requests.by_path.get(f"/for_manifest/{shard}", {}).get("open", 0)
        assert auto_opens >= 1, f"auto never opened {shard}: the mount did not count it"
        assert our_opens <= auto_opens, f"manifest_cache opened {shard} {our_opens} times, auto {auto_opens}"
