"""A vLLM engine started from ``s3://``: ``manifest_cache`` against ``runai_streamer``, requests and seconds.

A real S3 server (moto's ``moto_server``) holds the tiny Qwen3 of
``bench_engine_start.py`` (168 tensors) re-sharded into ``--shards`` shards (163 by
default) and published. Every request reaches the server through
``support.s3server.SlowProxy``, which waits ``--latency-ms`` (20 ms) first and counts it,
as a store a region away does. Side by side, alternating, ``--repeat`` times each, a
real vLLM CPU engine (``LLM(model="s3://...")``, engine core in this process) is built
with:

- ``runai_streamer``: vLLM's own object-store load (no check at all);
- ``manifest_cache``: the key and start checks from one GET of ``ckptpub.json``,
  vLLM's pulled files checked against it, every streamed tensor verified.

    python benchmarks/bench_s3_engine.py [--shards 163] [--latency-ms 20] [--repeat 2]

Prints a markdown table: requests (all, and ranged GETs of shards), median engine
start seconds, and the ratio of ``manifest_cache`` to ``runai_streamer``. Request
counts are deterministic; seconds depend on the machine's load, printed beside them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process: one timer

from bench_engine_start import build_base, reshard, start_engine  # noqa: E402
from support.s3server import SlowProxy, running_s3_server  # noqa: E402

FORMATS = ("runai_streamer", "manifest_cache")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=163)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as work:
        base, folder = os.path.join(work, "base"), os.path.join(work, "sharded")
        build_base(base)
        reshard(base, folder, args.shards)
        with running_s3_server(Path(work) / "moto.log") as server:
            bucket = server.new_bucket()
            url = server.upload(Path(folder), f"s3://{bucket}/model")
            proxy = SlowProxy(server.endpoint, args.latency_ms / 1000)
            os.environ.update({**server.env, "AWS_ENDPOINT_URL": proxy.endpoint})
            os.environ["VLLM_ASSETS_CACHE"] = os.path.join(work, "assets")  # vLLM's pulled files: ours
            seconds: dict[str, list[float]] = {name: [] for name in FORMATS}
            requests: dict[str, int] = {}
            for _ in range(args.repeat):
                for load_format in FORMATS:
                    before = proxy.requests
                    seconds[load_format].append(start_engine(url, load_format))
                    requests[load_format] = proxy.requests - before
            proxy.close()
    load = os.getloadavg()[0]
    print(f"{args.shards} shards, {args.latency_ms:g} ms a request; {os.cpu_count()} CPUs; load {load:.2f}\n")
    print("| load format | requests | engine start s (median) | vs runai_streamer |")
    print("| --- | --- | --- | --- |")
    reference = statistics.median(seconds["runai_streamer"])
    for load_format in FORMATS:
        median = statistics.median(seconds[load_format])
        print(f"| {load_format} | {requests[load_format]} | {median:.2f} | {median / reference:.2f}x |")


if __name__ == "__main__":
    main()
