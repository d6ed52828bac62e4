"""The vLLM loader's checks over the hostile corpus (no engine: the same functions it runs).

For every case that has a manifest: reading it as vLLM's weight-cache key does,
the stat guard, the small-file check and streaming verification of every weight
tensor. The loader must refuse (one-line RefusedError, never another exception)
exactly when the weights or files an engine reads are not what the manifest says,
and must never open a path outside the folder.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

pytest.importorskip("vllm")

from corpus import CASES  # noqa: E402

import ckptpub  # noqa: E402
from checkpoints import write_checkpoint  # noqa: E402

from ckptpub_vllm.errors import RefusedError  # noqa: E402
from ckptpub_vllm.key import checkpoint_key, load_manifest  # noqa: E402
from ckptpub_vllm.small_files import check_small_files  # noqa: E402
from ckptpub_vllm.staleness import check_not_stale  # noqa: E402
from ckptpub_vllm.verify_stream import StreamVerifier  # noqa: E402

#: Cases whose model, as an engine reads it, is still exactly the published one.
SERVED = {
    "manifest reordered and indented by hand",
    "file added",  # new.bin: not a file vLLM reads; `ckptpub verify` reports it
    "file added in a subfolder",
}
#: Opened by lazy imports and the platform probes of torch/vLLM, not checkpoint reads.
NOT_CHECKPOINT_READS = ("/proc/", "/sys/", "/dev/", sys.prefix, sys.base_prefix, str(ckptpub.__file__).rsplit("/src/", 1)[0])
LOADER_CASES = [c for c in CASES if c.published or c.name == "no manifest"]


def load_like_the_engine(folder: str) -> str:
    """What ManifestCacheLoader does before and while reading weights; returns the cache key."""
    from safetensors import safe_open

    key = checkpoint_key(folder)
    manifest = load_manifest(folder)
    if manifest is None:
        raise RefusedError(f"ckptpub: refusing {folder}: no {ckptpub.MANIFEST_NAME}")
    check_not_stale(folder, manifest)
    check_small_files(folder, manifest)
    verifier = StreamVerifier(folder, manifest, threads=1)
    try:
        for shard in manifest.weights:
            with safe_open(os.path.join(folder, shard), framework="pt") as handle:
                for name in handle.keys():
                    verifier.check(name, handle.get_tensor(name))
        verifier.finish()
    finally:
        verifier.close()
    return key


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory):
    folder = write_checkpoint(tmp_path_factory.mktemp("loader") / "published")
    ckptpub.publish(folder)
    return folder


@pytest.mark.parametrize("case", LOADER_CASES, ids=[c.name for c in LOADER_CASES])
def test_loader_refuses_exactly_what_it_must(tmp_path, published, case):
    folder = tmp_path / "ckpt"
    shutil.copytree(published, folder, symlinks=True)
    if not case.published:
        (folder / ckptpub.MANIFEST_NAME).unlink()
    case.damage(folder)
    root = os.path.realpath(folder)
    outside: list[str] = []

    def audit(event: str, args: tuple) -> None:
        if event == "open" and args and isinstance(args[0], (str, bytes)) and not str(args[0]).endswith((".py", ".pyc", ".so")):
            real = os.path.realpath(os.fsdecode(args[0]))
            if not real.startswith(root + os.sep) and not real.startswith(NOT_CHECKPOINT_READS):
                outside.append(real)

    sys.addaudithook(audit)  # hooks cannot be removed; this one only records while `outside` is watched
    try:
        key = load_like_the_engine(str(folder))
        outcome = "served"
    except RefusedError as error:
        message = str(error)
        assert "\n" not in message and message.startswith("ckptpub: refusing"), message
        outcome = "refused"
    finally:
        watched, outside[:] = list(outside), []
    assert outcome == ("served" if case.name in SERVED else "refused"), case.name
    if outcome == "served":
        assert key == ckptpub.read_manifest(folder).identity
    assert watched == [], f"{case.name}: opened outside the folder: {watched}"
