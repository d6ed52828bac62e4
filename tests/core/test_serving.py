"""``ckptpub.serving``, the engine-neutral checks every engine integration uses, without any engine.

Real folders written by the safetensors library, tensors streamed as bytes the way a
loader hands them over (numpy here; the vLLM plugin's torch side is tested in
``tests/vllm``): which manifest is trusted under which policy, the cache key, the files
an engine reads, and every tensor's name, dtype, shape and bytes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from support.checkpoints import model_tensors, write_checkpoint

import ckptpub
from ckptpub.serving import (
    INLINE_HASH_BYTES,
    Policy,
    RefusedError,
    StreamVerifier,
    check_engine_files,
    check_shards_are_files,
    shard_problems,
    trusted_model,
)
from ckptpub.signing import TrustedKey

OTHER = "blake3:" + "1" * 64
LARGE = "lm_head.weight"  # 256 KiB: over INLINE_HASH_BYTES, so hashed on the pool and found later


@pytest.fixture
def published(tmp_path: Path) -> Path:
    tensors = model_tensors() | {LARGE: np.arange(512 * 128, dtype=np.float32).reshape(512, 128)}
    assert tensors[LARGE].nbytes > INLINE_HASH_BYTES  # the premise of the tests that tamper with it
    folder = write_checkpoint(tmp_path / "model", tensors, shards=2)
    ckptpub.publish(folder)
    return folder


def stream(folder: Path):
    """(name, dtype code, shape, bytes) of every tensor, as a loader yields them: shard by shard."""
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), framework="numpy") as reader:
            for name in reader.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                array = reader.get_tensor(name)
                yield name, reader.get_slice(name).get_dtype(), array.shape, array.tobytes()


def test_a_trusted_model_is_keyed_by_its_identity(published: Path) -> None:
    model = trusted_model(str(published), policy=Policy())
    manifest = ckptpub.read_manifest(published)
    assert (model.folder, model.cache_key) == (str(published), manifest.identity)
    pinned = trusted_model(str(published), policy=Policy(expect_identity=manifest.identity))
    assert pinned.cache_key == manifest.identity


def test_the_policy_decides_a_folder_without_a_manifest(tmp_path: Path) -> None:
    folder = str(write_checkpoint(tmp_path / "plain"))
    with pytest.raises(RefusedError, match=rf"no ckptpub.json; publish it with `ckptpub publish {folder}`"):
        trusted_model(folder, policy=Policy())
    with pytest.raises(RefusedError, match="the pinned identity .* cannot be checked"):
        trusted_model(folder, policy=Policy(require_manifest=False, expect_identity=OTHER))
    assert trusted_model(folder, policy=Policy(require_manifest=False)).cache_key is None


def test_a_pin_of_another_identity_and_an_unusable_manifest_are_refused(published: Path) -> None:
    with pytest.raises(RefusedError, match=f"is not the expected {OTHER}"):
        trusted_model(str(published), policy=Policy(expect_identity=OTHER))
    (published / ckptpub.MANIFEST_NAME).write_bytes(b"{}")
    with pytest.raises(RefusedError, match="ckptpub.json is unusable") as refused:
        trusted_model(str(published), policy=Policy(require_manifest=False))
    assert str(refused.value).startswith(f"ckptpub: refusing to serve {published}: ")


def test_a_trusted_key_requires_the_signature(published: Path, tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("not a key")
    policy = Policy(trusted=TrustedKey(public_key=str(key)))
    with pytest.raises(RefusedError, match="a signed checkpoint is required"):
        trusted_model(str(published), policy=policy)


def test_a_hub_id_that_is_not_in_the_cache_is_refused(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RefusedError, match="refusing to serve acme/absent"):
        trusted_model("acme/absent", policy=Policy())


def test_the_environments_policy_fails_closed_on_a_flag_it_cannot_read() -> None:
    assert Policy.from_environment({}) == Policy(require_manifest=False)
    assert Policy.from_environment({"CKPTPUB_REQUIRE_MANIFEST": "on"}).require_manifest
    with pytest.raises(ckptpub.CkptpubError, match="'maybe' is neither on"):
        Policy.from_environment({"CKPTPUB_REQUIRE_MANIFEST": "maybe"})


def test_every_streamed_tensor_is_verified_and_counted(published: Path) -> None:
    manifest = ckptpub.read_manifest(published)
    verifier = StreamVerifier(str(published), manifest, threads=2)
    for name, dtype, shape, data in stream(published):
        assert verifier.expect(name, dtype, shape)
        verifier.hash(name, data)
    verifier.finish()
    assert verifier.verified_tensors == verifier.total_tensors == len(model_tensors()) + 1


@pytest.mark.parametrize(
    "changed", [None, "model.norm.weight", LARGE], ids=["none", "a small one", "a large one"]
)
def test_tensors_hashed_together_are_each_counted_and_a_changed_one_is_named(
    published: Path, changed
) -> None:
    """``hash_together``: one pool job for a run of tensors (an adapter's), each compared on its own."""
    manifest = ckptpub.read_manifest(published)
    verifier = StreamVerifier(str(published), manifest, threads=2)
    runs: list[list[tuple[str, bytes]]] = [[], []]
    for index, (name, dtype, shape, data) in enumerate(stream(published)):
        assert verifier.expect(name, dtype, shape)
        runs[index % 2].append((name, bytes(len(data)) if name == changed else bytes(data)))

    def hash_all() -> None:
        for run in runs:
            verifier.hash_together(run)
        verifier.finish()

    if changed is None:
        hash_all()
        assert verifier.verified_tensors == verifier.total_tensors
        return
    with pytest.raises(RefusedError, match=f"tensor '{re.escape(changed)}' differs from the manifest"):
        hash_all()  # refused in the call that collects the run's digests, whichever that is


def test_the_large_tensor_is_hashed_on_the_pool() -> None:
    assert INLINE_HASH_BYTES < 512 * 128 * 4


def stream_through(verifier: StreamVerifier, folder: Path, tamper) -> None:
    """Every tensor of ``folder`` through ``verifier``, the embedding changed by ``tamper`` first."""
    for name, dtype, shape, data in stream(folder):
        if name == LARGE:
            name, dtype, shape, data = tamper(name, dtype, shape, data)
        if verifier.expect(name, dtype, shape):
            verifier.hash(name, data)
    verifier.finish()


@pytest.mark.parametrize(
    ("tamper", "refusal"),
    [
        (lambda n, d, s, b: (n + ".x", d, s, b), f"tensor '{LARGE}.x' is not in the manifest"),
        (lambda n, d, s, b: (n, "F64", s, b), f"tensor '{LARGE}' has dtype F64, the manifest says F32"),
        (lambda n, d, s, b: (n, d, (1, *s), b), "has shape [1, 512, 128], the manifest says [512, 128]"),
        (lambda n, d, s, b: (n, d, s, bytes(len(b))), f"tensor '{LARGE}' differs from the manifest"),
    ],
    ids=["unknown name", "dtype", "shape", "bytes"],
)
def test_a_streamed_tensor_that_differs_is_refused_by_name(published: Path, tamper, refusal) -> None:
    manifest = ckptpub.read_manifest(published)
    verifier = StreamVerifier(str(published), manifest)
    with pytest.raises(RefusedError, match=re.escape(refusal)) as refused:
        stream_through(verifier, published, tamper)
    assert manifest.identity in str(refused.value)


def test_a_tensor_read_twice_or_never_is_refused(published: Path) -> None:
    manifest = ckptpub.read_manifest(published)
    tensors = list(stream(published))
    twice = StreamVerifier(str(published), manifest)
    twice.expect(*tensors[0][:3])
    with pytest.raises(RefusedError, match="was read twice"):
        twice.expect(*tensors[0][:3])
    never = StreamVerifier(str(published), manifest)
    for name, dtype, shape, data in tensors[1:]:
        never.expect(name, dtype, shape)
        never.hash(name, data)
    with pytest.raises(RefusedError, match=f"manifest tensor {tensors[0][0]!r} never arrived"):
        never.finish()


def test_a_rank_hashes_its_share_and_refuses_when_its_share_never_came(published: Path) -> None:
    manifest = ckptpub.read_manifest(published)
    tensors = list(stream(published))
    mine = frozenset(name for name, *_ in tensors[:3])
    verifier = StreamVerifier(str(published), manifest)
    verifier.assign(mine)
    hashed = [name for name, dtype, shape, _ in tensors[1:] if verifier.expect(name, dtype, shape)]
    assert set(hashed) == mine - {tensors[0][0]}
    verifier.mark_partial("this rank sees part of the checkpoint")
    with pytest.raises(RefusedError, match=f"tensor {tensors[0][0]!r}, this rank's to hash, never arrived"):
        verifier.finish()


def test_the_files_an_engine_reads_are_checked_through_the_cores_readers(published: Path) -> None:
    manifest = ckptpub.read_manifest(published)
    check_engine_files(str(published), manifest)
    config = json.loads((published / "config.json").read_text())
    (published / "config.json").write_text(json.dumps({**config, "rope_theta": 1.0}, indent=2))
    (published / "chat_template.jinja").write_text("{{ messages }}")
    with pytest.raises(RefusedError, match=r"chat_template.jinja is not in the manifest.* \(and 1 more\)"):
        check_engine_files(str(published), manifest)


def test_the_shards_an_engine_opens_itself_are_plain_files_inside(published: Path, tmp_path: Path) -> None:
    check_shards_are_files(str(published))
    shard = sorted(published.glob("*.safetensors"))[0]
    outside = shutil.copy(shard, tmp_path / "outside.safetensors")
    shard.unlink()
    shard.symlink_to(outside)
    with pytest.raises(RefusedError, match=f"shard {shard.name}: symlink points outside the checkpoint"):
        check_shards_are_files(str(published))
    shard.unlink()
    os.mkfifo(shard)
    with pytest.raises(RefusedError, match=f"shard {shard.name}: a named pipe"):
        check_shards_are_files(str(published))
    shard.unlink()
    assert shard_problems(str(published), ckptpub.read_manifest(published)) == [
        f"shard {shard.name} is missing"
    ]
