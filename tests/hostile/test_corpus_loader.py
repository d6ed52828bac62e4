"""The vLLM loader's checks over the hostile corpus (no engine: the same functions it runs).

For every case that has a manifest: reading it as vLLM's weight-cache key does,
the start-time checks (``startup.check_before_start``: manifest, engine files) and
streaming verification of every weight tensor as vLLM reads it. The loader must refuse (one-line RefusedError, never another exception)
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
from ckptpub_vllm.key import checkpoint_key  # noqa: E402
from ckptpub_vllm.options import Options  # noqa: E402
from ckptpub_vllm.startup import check_before_start  # noqa: E402
from ckptpub_vllm.verify_stream import StreamVerifier  # noqa: E402

#: Cases whose model, as an engine reads it, is still exactly the published one.
SERVED = {
    "manifest reordered and indented by hand",
    "file added",  # new.bin: not a file vLLM reads; `ckptpub verify` reports it
    "file added in a subfolder",
    "file truncated",  # optimizer.pt: training state, which no engine reads
}
#: Opened by lazy imports and the platform probes of torch/vLLM, not checkpoint reads.
NOT_CHECKPOINT_READS = ("/proc/", "/sys/", "/dev/", sys.prefix, sys.base_prefix, str(ckptpub.__file__).rsplit("/src/", 1)[0])
LOADER_CASES = [c for c in CASES if c.published or c.name == "no manifest"]


def load_like_the_engine(folder: str) -> str:
    """What ManifestCacheLoader does before and while reading weights; returns the cache key."""
    from safetensors import safe_open

    key = checkpoint_key(folder)
    manifest = check_before_start(folder, Options())
    verifier = StreamVerifier(folder, manifest, threads=1)

    def shards_as_vllm_reads_them():
        for shard in sorted(name for name in os.listdir(folder) if name.endswith(".safetensors")):
            with safe_open(os.path.join(folder, shard), framework="pt") as handle:
                for name in handle.keys():
                    yield name, handle.get_tensor(name)

    try:
        for _ in verifier.wrap(shards_as_vllm_reads_them()):
            pass
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
            path = os.fsdecode(args[0])
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            # O_NOFOLLOW opens no symlink in the last component: only the folder part resolves.
            real = (os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
                    if flags & os.O_NOFOLLOW else os.path.realpath(path))
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
