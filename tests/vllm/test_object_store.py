"""Serving from the bucket (issue 32 item 3): ``s3://`` models with ``--load-format manifest_cache``.

Real parts only: a real S3 server (moto's, ``support.s3server``), vLLM's own pull of the
small files and its own object-store streamer (runai-model-streamer over HTTP), vLLM CPU
engines, and vLLM's real weight-cache daemon (``vllm preload``, behind the CPU shim of
``tests/daemon_sim``). What each engine start asks of the bucket is read from the server's
request log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import ckptpub_vllm
import pytest
from ckptpub_vllm import daemon as plugin_daemon
from ckptpub_vllm.shared import daemon_reports, key
from support.s3server import S3Server
from support.vllm_engine_helpers import DAEMON_ARGS, SHIM_ENV, TAMPERED_TENSOR, run_engines, same_size_edit

import ckptpub
from ckptpub.serving import RefusedError


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """vLLM's assets cache, this module's own: where vLLM pulls an ``s3://`` model's small files."""
    path = tmp_path_factory.mktemp("assets")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ASSETS_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def in_bucket(models, s3_server: S3Server, assets: Path) -> dict[str, str]:
    """v1 (published) and its tampered copy (one tensor zeroed, v1's manifest) as ``s3://`` prefixes."""
    bucket = s3_server.new_bucket()
    return {
        name: s3_server.upload(Path(models[name]), f"s3://{bucket}/{name}") for name in ("v1", "tampered")
    }


@pytest.fixture(scope="module")
def plugin() -> None:
    ckptpub_vllm.register()


def engine_config(model: str, load_format: str = "manifest_cache"):  # noqa: ANN201  # vLLM's VllmConfig
    """vLLM's configuration of an engine of ``model``, as ``LLM()`` and ``vllm serve`` build it."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=model,
        load_format=load_format,
        dtype="float32",
        max_model_len=128,
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
    ).create_engine_config()


def manifest_requests(requests: list[str], url: str) -> dict[str, int]:
    """How often each method asked for ``url``'s ``ckptpub.json``."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    counts: dict[str, int] = {}
    for request in requests:
        method, path, _ = request.split(" ")
        if path == f"/{bucket}/{prefix}/ckptpub.json":
            counts[method] = counts.get(method, 0) + 1
    return counts


def test_the_key_is_one_get_of_the_buckets_manifest_and_no_shard(plugin, in_bucket, s3_server, models):
    from vllm.model_executor.model_loader.weight_cache.protocol import WeightCacheKey

    url = in_bucket["v1"]
    config = engine_config(url)  # vLLM pulls the small files; its config check lets manifest_cache through
    assert config.load_config.load_format == "manifest_cache"
    assert config.model_config.model_weights == url
    copy = config.model_config.model
    since = len(s3_server.requests_logged())
    location = plugin_daemon.daemon_location(config, config.model_config)  # a daemon's way to its key
    manifest = plugin_daemon.keyed_manifest(config, location.folder, location.copy)
    with key.checked(copy, manifest, location.folder):
        cache_key = WeightCacheKey.from_model_config(config.model_config, tp_size=1, tp_rank=0)
    bucket = url.removeprefix("s3://").partition("/")[0]
    assert s3_server.requests_logged()[since:] == [f"GET /{bucket}/v1/ckptpub.json HTTP/1.1"]
    assert (location.folder, location.copy) == (url, copy)
    assert cache_key.checkpoint == ckptpub.read_manifest(models["v1"]).identity

    # vLLM's pulled copy is never keyed by its own ckptpub.json, which may be stale
    with pytest.raises(RefusedError, match="keyed only by the manifest in the bucket"):
        WeightCacheKey.from_model_config(config.model_config, tp_size=1, tp_rank=0)


def test_vllm_still_refuses_other_load_formats_for_an_object_store_model(plugin, in_bucket):
    with pytest.raises(ValueError, match="To load a model from object storage"):
        engine_config(in_bucket["v1"], "ipc_cache")
    assert engine_config(in_bucket["v1"], "auto").load_config.load_format == "runai_streamer"


def test_a_daemon_of_a_published_s3_model_refuses_an_unverifying_loader(plugin, in_bucket, s3_server):
    """vLLM turns ``auto`` into ``runai_streamer`` for an object-store model; a daemon keyed by the bucket's
    manifest would hold unverified bytes under its identity, so it refuses (issue 32 item 1's rule), asking
    the bucket with one HEAD."""
    url = in_bucket["v1"]
    config = engine_config(url, "auto")
    since = len(s3_server.requests_logged())
    with pytest.raises(RefusedError) as refused:
        plugin_daemon.daemon_location(config, config.model_config)
    assert str(refused.value) == (
        f"ckptpub: refusing to serve {url}: a weight-cache daemon keyed by its manifest's identity "
        "loads only through a verifying loader, and --load-format runai_streamer does not verify; "
        "start it with --load-format manifest_cache (its options in --model-loader-extra-config)"
    )
    bucket = url.removeprefix("s3://").partition("/")[0]
    assert s3_server.requests_logged()[since:] == [f"HEAD /{bucket}/v1/ckptpub.json HTTP/1.1"]


@pytest.mark.parametrize("change", ["deleted from the bucket", "edited in the bucket"])
def test_a_stale_or_changed_copy_of_the_small_files_is_refused(plugin, models, s3_server, tmp_path, change):
    """vLLM keeps its copy of a prefix's small files and never cleans it: a file deleted from the bucket
    (and the prefix published again without it) stays there and would be read; a file changed in the
    bucket after publishing is pulled again. Both are refused against the bucket's manifest."""
    bucket = s3_server.new_bucket()
    url = s3_server.upload(Path(models["v1"]), f"s3://{bucket}/m")
    engine_config(url)  # pulled and served as published
    client = s3_server.client()
    if change == "deleted from the bucket":
        client.delete_object(Bucket=bucket, Key="m/generation_config.json")
        ckptpub.publish(url)
        problem = "generation_config.json is not in the manifest, and an engine reads it"
    else:
        edited = tmp_path / "config.json"
        edited.write_bytes(Path(models["v1"], "config.json").read_bytes())
        same_size_edit(str(edited), b'"rope_theta": 10000.0', b'"rope_theta": 10001.0')
        client.upload_file(str(edited), bucket, "m/config.json")
        problem = "config.json: bytes differ from the manifest"
    with pytest.raises(RefusedError) as refused:
        engine_config(url)
    line = str(refused.value)
    assert line.startswith(f"ckptpub: refusing to serve {url}: the engine's copy of its files ("), line
    assert problem in line
    assert "\n" not in line


@pytest.fixture(scope="module")
def s3_engines(models, in_bucket, s3_server) -> tuple[dict[str, dict], str, list[str]]:
    """Engines (in one runner): v1's local folder with ``auto``, then v1 and the tampered copy from the
    bucket with ``manifest_cache``; their results, log, and the requests of v1's start from the bucket."""
    jobs = {
        "local_auto": (models["v1"], "auto"),
        "s3_manifest": (in_bucket["v1"], "manifest_cache"),
        "s3_tampered": (in_bucket["tampered"], "manifest_cache"),
    }
    since = len(s3_server.requests_logged())
    results, log = run_engines([{"model": model, "load_format": fmt} for model, fmt in jobs.values()])
    bucket = in_bucket["v1"].removeprefix("s3://").partition("/")[0]
    v1_requests = [
        r for r in s3_server.requests_logged()[since:] if f"/{bucket}/v1/" in r or "prefix=v1/" in r
    ]
    return dict(zip(jobs, results, strict=True)), log, v1_requests


@pytest.mark.slow  # vLLM engines
def test_served_from_the_bucket_with_the_tokens_auto_gives_for_the_local_folder(s3_engines, in_bucket):
    results, log, _ = s3_engines
    local, ours = results["local_auto"], results["s3_manifest"]
    assert "tokens" in local, local
    assert ours.get("tokens") == local["tokens"], ours
    assert "ckptpub: loaded and verified 25 of 25 tensors (0.00 GiB here) of " in log
    assert f" from {in_bucket['v1']} in " in log


@pytest.mark.slow  # vLLM engines
def test_a_tampered_object_is_refused_by_tensor_name(s3_engines, in_bucket):
    error = s3_engines[0]["s3_tampered"].get("error", "")
    assert error.startswith(
        f"RefusedError: ckptpub: refusing to serve {in_bucket['tampered']}: tensor '{TAMPERED_TENSOR}' "
        "differs from the manifest"
    ), error


@pytest.mark.slow  # vLLM engines
def test_an_engine_start_reads_the_buckets_manifest_and_streams_every_shard(s3_engines, models):
    _, _, requests = s3_engines
    url_path = requests[0].split(" ")[1]
    bucket = url_path.split("/")[1].split("?")[0]
    counts = manifest_requests(requests, f"s3://{bucket}/v1")
    # vLLM's pull copies ckptpub.json with the other *.json (a HEAD, then a GET, per pull); ckptpub's own
    # reads are plain GETs: the front end's start check and the loader's (one process here)
    assert counts["GET"] - counts["HEAD"] == 2, requests
    shards = sorted(name for name in os.listdir(models["v1"]) if name.endswith(".safetensors"))
    streamed = {r.split(" ")[1].rsplit("/", 1)[1] for r in requests if r.endswith(".safetensors HTTP/1.1")}
    assert streamed == set(shards), requests
    assert not [r for r in requests if not r.startswith(("GET ", "HEAD "))], requests


@pytest.mark.slow  # vLLM's own `vllm preload` and its daemon child, behind the CPU shim
def test_a_daemon_of_an_s3_model_is_keyed_by_the_buckets_manifest_and_loads_verified(
    in_bucket, models, tmp_path
):
    url = in_bucket["v1"]
    identity = ckptpub.read_manifest(models["v1"]).identity
    command = [sys.executable, "-m", "ckptpub_vllm.preload.vllm_launcher", "preload", "--model", url]
    command += ["--load-format", "manifest_cache", *DAEMON_ARGS]
    log_path = tmp_path / "daemon.log"
    env = {**os.environ, **SHIM_ENV, "TMPDIR": str(tmp_path)}
    with open(log_path, "wb") as log:
        daemon = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    events: dict[str, dict] = {}
    try:
        deadline = time.monotonic() + 300
        while daemon.poll() is None and time.monotonic() < deadline:
            reports = [
                daemon_reports.parse(line) for line in log_path.read_text(errors="replace").splitlines()
            ]
            events = {r["event"]: r for r in reports if r is not None}
            if daemon_reports.SERVING in events:
                break
            time.sleep(1)
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    output = log_path.read_text(errors="replace")
    assert daemon_reports.SERVING in events, output[-4000:]
    assert (events["keyed"]["folder"], events["keyed"]["identity"]) == (url, identity), json.dumps(events)
    verified = events["verified"]
    assert (verified["folder"], verified["tensors"], verified["total"]) == (url, 25, 25)
    assert events["serving"]["identity"] == identity
