"""``ckptpub verify s3://...`` under torchrun: the objects spread over real ranks (gloo, this machine)."""

from __future__ import annotations

import os
import re

import pytest
from support.checkpoints import model_tensors, run_cli, tensor_range, write_checkpoint
from support.runs import run_group, torchrun

import ckptpub
from ckptpub._hashing.distributed import assign_files
from ckptpub._hashing.engine import Span


@pytest.mark.slow
def test_verify_under_torchrun_spreads_the_objects_and_finds_a_byte_rank_1_hashes(
    s3_server, bucket, tmp_path
):
    model = write_checkpoint(tmp_path / "model", model_tensors(), shards=4)
    url = s3_server.upload(model, f"s3://{bucket}/m")
    assert run_cli("publish", url).returncode == 0
    manifest = ckptpub.read_manifest(url)
    files = [Span(f.path, 0, f.size, f.path) for f in manifest.files]
    owners = dict(zip((f.path for f in manifest.files), assign_files(files, 2), strict=True))
    tensor = next(t for t in manifest.tensors if owners[t.file] == 1)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = torchrun(2, "-m", "ckptpub", "verify", url)

    r = run_group(command, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ranks read the folder from different storage" not in r.stderr  # the work was shared

    start, _ = tensor_range(model / tensor.file, tensor.name)
    data = bytearray((model / tensor.file).read_bytes())
    data[start] ^= 0xFF
    s3_server.client().put_object(Bucket=bucket, Key=f"m/{tensor.file}", Body=bytes(data))
    r = run_group(command, timeout=120, env=env)
    assert r.returncode == 1, r.stderr[-3000:]
    exits = dict(re.findall(r"rank\s*: (\d+) \(local_rank: \d+\)\s*exitcode\s*: (-?\d+)", r.stderr))
    assert exits == {"0": "1", "1": "1"}, r.stderr[-3000:]  # the same verdict on both ranks
    failed = [line for line in r.stdout.splitlines() if "FAILED" in line]
    assert len(failed) == 1, r.stdout  # printed once, by rank 0
    assert tensor.name in failed[0]
