"""``ckptpub verify s3://...`` against a plain parallel download of the same objects, side by side.

A real S3 server (moto's ``moto_server``, on 127.0.0.1) holds a checkpoint of
``--shards`` safetensors shards (``--gb`` in all, random float16 tensors of
``--tensor-mb``, plus a config), published with ckptpub. Per ``--latency-ms`` (0: the
server as it is; more: through ``support.s3server.SlowProxy``, which waits that long
on every request, as a distant region does), alternating, ``--repeat`` times:

(a) a plain parallel download: boto3 GETs every object whole, 16 at once, each body
    read into a reused 8 MiB buffer and dropped (what any fast downloader does; no
    hashing, nothing written);
(b) ``ckptpub verify s3://bucket/prefix`` as a subprocess: the listing, each shard's
    header, then every byte hashed and compared with the manifest.

``b3sum`` of the same files on local disk is printed first: what hashing alone costs
on this machine's cores, the part of (b) that (a) does not do.

    python benchmarks/bench_s3.py [--shards 163] [--gb 2] [--latency-ms 0 20] [--repeat 3]

Prints a markdown table: median seconds, MB/s, requests and the ratio (b)/(a). On a
two-core machine the server itself (Python) and the client share the cores, so the
figures are a floor for the server's speed, not S3's; the ratio is the point.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from support.s3server import S3Server, SlowProxy, running_s3_server  # noqa: E402

DOWNLOAD_THREADS = 16
BUFFER_BYTES = 8 << 20


def build(folder: Path, shards: int, total_bytes: int, tensor_mb: int) -> None:
    """``shards`` shards of random float16 tensors, ``total_bytes`` in all, then published."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    import ckptpub

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    per_shard = total_bytes // shards
    per_tensor = min(per_shard, tensor_mb << 20) // 2
    weight_map = {}
    for shard in range(shards):
        name = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for index in range(max(1, per_shard // (per_tensor * 2))):
            tensor = f"layers.{shard}.w{index}"
            tensors[tensor] = rng.integers(0, 1 << 16, per_tensor, dtype=np.uint16).view(np.float16)
            weight_map[tensor] = name
        save_file(tensors, str(folder / name))
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    (folder / "config.json").write_text(json.dumps({"model_type": "bench"}))
    ckptpub.publish(folder)


def download(endpoint: str, server: S3Server, bucket: str, prefix: str) -> tuple[float, int]:
    """Seconds and bytes for GETting every object below ``prefix``, ``DOWNLOAD_THREADS`` at once."""
    import boto3
    from botocore.config import Config

    client = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
        config=Config(max_pool_connections=DOWNLOAD_THREADS * 2),
    )
    started = time.perf_counter()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]]
    buffers: dict[int, bytearray] = {}

    def fetch(key: str) -> int:
        buffer = buffers.setdefault(threading.get_ident(), bytearray(BUFFER_BYTES))
        body, total = client.get_object(Bucket=bucket, Key=key)["Body"], 0
        while got := body.readinto(buffer):
            total += got
        return total

    with concurrent.futures.ThreadPoolExecutor(DOWNLOAD_THREADS) as pool:
        total = sum(pool.map(fetch, keys))
    return time.perf_counter() - started, total


def verify(endpoint: str, server: S3Server, url: str) -> float:
    env = {**os.environ, **server.env, "AWS_ENDPOINT_URL": endpoint}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "ckptpub", "verify", "--quiet", url], env=env, capture_output=True
    )
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"verify failed: {result.stderr.decode()[-2000:]}")
    return seconds


def b3sum_seconds(folder: Path) -> float:
    """``b3sum`` of the same files on local disk (page cache warm): the hashing this machine's cores cost."""
    files = sorted(str(p) for p in folder.iterdir() if p.name != "ckptpub.json")
    subprocess.run(["b3sum", *files], check=True, capture_output=True)  # warm the cache
    started = time.perf_counter()
    subprocess.run(["b3sum", *files], check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=163)
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--tensor-mb", type=int, default=4)
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 20.0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as work:
        folder = Path(work) / "model"
        build(folder, args.shards, int(args.gb * (1 << 30)), args.tensor_mb)
        with running_s3_server(Path(work) / "moto.log") as server:
            bucket = server.new_bucket()
            url = server.upload(folder, f"s3://{bucket}/model")
            print(
                f"{args.shards} shards, {args.gb} GB; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}\n"
            )
            hashing = b3sum_seconds(folder)
            print(f"b3sum of the same bytes on local disk: {hashing:.2f} s\n")
            header = ["latency", "plain download (s)", "MB/s", "ckptpub verify (s)", "MB/s"]
            print("| " + " | ".join([*header, "verify / download", "verify's requests"]) + " |")
            print("| --- | --- | --- | --- | --- | --- | --- |")
            for latency_ms in args.latency_ms:
                proxy = SlowProxy(server.endpoint, latency_ms / 1000) if latency_ms else None
                endpoint = proxy.endpoint if proxy else server.endpoint
                plain, checked, size, requests = [], [], 0, ""
                for _ in range(args.repeat):
                    seconds, size = download(endpoint, server, bucket, "model")
                    plain.append(seconds)
                    before = proxy.requests if proxy else 0
                    checked.append(verify(endpoint, server, url))
                    if proxy:
                        requests = str(proxy.requests - before)
                if proxy:
                    proxy.close()
                a, b = statistics.median(plain), statistics.median(checked)
                mb = size / 1e6
                cells = [f"{latency_ms:g} ms", f"{a:.2f}", f"{mb / a:.0f}", f"{b:.2f}", f"{mb / b:.0f}"]
                print("| " + " | ".join([*cells, f"{b / a:.2f}x", requests]) + " |")


if __name__ == "__main__":
    main()
