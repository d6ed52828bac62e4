"""``ckptpub.serving`` on an ``s3://`` prefix, against a real S3 server: what an engine integration asks.

The engine-neutral answers an engine serving from a bucket builds on (the vLLM plugin's use
of them, with real engines, is ``tests/vllm/test_object_store.py``): which manifest (one GET of
the bucket's own), whether there is one (one HEAD), the engine's local copy of the small files
checked against it, and the shards named when reading them failed. Nothing is mocked.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.checkpoints import model_tensors, tensor_range, write_checkpoint
from support.s3server import S3Server

import ckptpub
from ckptpub.serving import (
    Policy,
    RefusedError,
    check_engine_files,
    check_shards_are_files,
    has_manifest,
    model_folder,
    read_folder_manifest,
    shard_problems,
    trusted_model,
)

SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A two-shard checkpoint folder with a config (unpublished)."""
    folder = write_checkpoint(tmp_path / "model", model_tensors(), shards=2)
    (folder / "config.json").write_text('{"model_type": "tiny", "hidden_size": 8}')
    return folder


@pytest.fixture
def in_bucket(s3_server: S3Server, bucket: str, model: Path) -> str:
    return s3_server.upload(model, f"s3://{bucket}/m")


def test_the_buckets_manifest_is_trusted_from_one_get(s3_server, in_bucket, model):
    assert model_folder(in_bucket + "/") == in_bucket
    assert not has_manifest(in_bucket)
    assert read_folder_manifest(in_bucket) is None
    with pytest.raises(RefusedError, match=f"no ckptpub.json; publish it with `ckptpub publish {in_bucket}`"):
        trusted_model(in_bucket, policy=Policy())

    identity = ckptpub.publish(in_bucket).identity
    assert identity == ckptpub.publish(model).identity
    assert has_manifest(in_bucket)
    before = len(s3_server.requests_logged())
    found = trusted_model(in_bucket, policy=Policy())
    assert (found.folder, found.cache_key) == (in_bucket, identity)
    bucket_and_prefix = in_bucket.removeprefix("s3://")
    assert s3_server.requests_logged()[before:] == [f"GET /{bucket_and_prefix}/ckptpub.json HTTP/1.1"]


def test_an_unreachable_manifest_is_a_refusal_never_no_manifest(s3_server):
    with pytest.raises(RefusedError, match="no such bucket"):
        read_folder_manifest("s3://no-such-bucket-of-ckptpub/m")
    # a HEAD's answer has no body: no bucket reads as no object there, and the read above refuses it
    assert not has_manifest("s3://no-such-bucket-of-ckptpub/m")
    with pytest.raises(RefusedError, match=r"gs:// is not read directly"):
        model_folder("gs://bucket/m")


def test_the_engines_copy_of_the_small_files_is_checked_against_the_buckets_manifest(
    in_bucket, model, tmp_path
):
    manifest = ckptpub.publish(in_bucket)
    copy = shutil.copytree(model, tmp_path / "copy", ignore=shutil.ignore_patterns("*.safetensors"))
    check_engine_files(str(copy), manifest, copy_of=in_bucket)
    (copy / "tokenizer_config.json").write_text("{}")  # a file the bucket no longer has, say
    with pytest.raises(RefusedError) as refused:
        check_engine_files(str(copy), manifest, copy_of=in_bucket)
    assert str(refused.value).startswith(
        f"ckptpub: refusing to serve {in_bucket}: the engine's copy of its files ({copy}): "
        "tokenizer_config.json is not in the manifest, and an engine reads it; "
        f"run `ckptpub verify {in_bucket}`"
    )


def test_shards_in_a_bucket_are_named_when_reading_them_failed(s3_server, in_bucket, model):
    manifest = ckptpub.publish(in_bucket)
    before = len(s3_server.requests_logged())
    check_shards_are_files(in_bucket)  # objects are neither symlinks nor FIFOs
    assert s3_server.requests_logged()[before:] == []
    assert shard_problems(in_bucket, manifest) == []

    bucket, prefix = in_bucket.removeprefix("s3://").split("/", 1)
    client = s3_server.client()
    data = bytearray((model / SHARD).read_bytes())
    start, _ = tensor_range(model / SHARD, "model.embed_tokens.weight")
    data[9] ^= 0x01  # inside the header, same size
    client.put_object(Bucket=bucket, Key=f"{prefix}/{SHARD}", Body=bytes(data))
    assert shard_problems(in_bucket, manifest) == [
        f"shard {SHARD}: its header differs from the manifest (damaged?)"
    ]
    client.put_object(Bucket=bucket, Key=f"{prefix}/{SHARD}", Body=bytes(data[:start]))
    assert shard_problems(in_bucket, manifest) == [
        f"shard {SHARD} has {start} bytes, the manifest says {len(data)}"
    ]
    client.delete_object(Bucket=bucket, Key=f"{prefix}/{SHARD}")
    assert shard_problems(in_bucket, manifest) == [f"shard {SHARD} is missing"]
