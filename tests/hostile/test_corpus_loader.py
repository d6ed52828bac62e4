"""The vLLM loader's checks over the hostile corpora (no engine: the same functions it runs).

For every corpus case that has a manifest, and every generated engine-start case
(``engine_cases``): the start-time checks (``startup.check_before_start``: manifest,
pin, engine files), the weight-cache key, and streaming verification of every weight
tensor as vLLM reads it. The loader must refuse (one-line RefusedError, never another
exception) exactly when the weights or files an engine reads are not what the
manifest says, must never open a path outside the folder, and must never hang.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

pytest.importorskip("vllm")

from ckptpub_vllm.shared.key import checkpoint_key  # noqa: E402
from ckptpub_vllm.shared.options import Options, split_extra_config  # noqa: E402
from ckptpub_vllm.shared.startup import check_before_start  # noqa: E402
from ckptpub_vllm.worker.verify_stream import TensorVerifier  # noqa: E402
from support.checkpoints import deadline, write_checkpoint  # noqa: E402

import ckptpub  # noqa: E402
from ckptpub.serving import RefusedError, check_shards_are_files  # noqa: E402
from tests.hostile.corpus import CASES  # noqa: E402
from tests.hostile.engine_cases import ENGINE_CASES, PIN, add_engine_files  # noqa: E402

#: Cases whose model, as an engine reads it, is still exactly the published one.
SERVED = {
    "file added",  # new.bin: not a file vLLM reads; `ckptpub verify` reports it
    "file added in a subfolder",
    "file truncated",  # optimizer.pt: training state, which no engine reads
    "folder named like a temp file, added after publishing",
    "FIFO named like a temp file, added after publishing",
    "subfolder safetensors listed as a plain file",  # vLLM reads top-level shards only
    "UTF-8 file names added after publishing",
    "layout region entries in another order",  # the model region (by name) is true; verify sees the lie
}
#: Opened by lazy imports and the platform probes of torch/vLLM, not checkpoint reads.
NOT_CHECKPOINT_READS = (
    "/proc/",
    "/sys/",
    "/dev/",
    sys.prefix,
    sys.base_prefix,
    str(ckptpub.__file__).rsplit("/src/", 1)[0],
)
LOADER_CASES = [c for c in CASES if c.published or c.name == "no manifest"]


def load_like_the_engine(folder: str, options: Options | None = None) -> str | None:
    """What ManifestCacheLoader does before and while reading weights; returns the cache key."""
    manifest = check_before_start(folder, options or Options())
    key = checkpoint_key(folder)
    if manifest is None:  # require_manifest false: vLLM's own key and an unverified load
        return key
    verify_as_vllm_streams(folder, manifest)
    return key


def verify_as_vllm_streams(folder: str, manifest: ckptpub.Manifest) -> None:
    """The loader's disk path: every shard read as vLLM reads it, each tensor checked against ``manifest``."""
    from safetensors import safe_open

    check_shards_are_files(folder)
    verifier = TensorVerifier(folder, manifest, threads=1)

    def shards_as_vllm_reads_them():
        for shard in sorted(name for name in os.listdir(folder) if name.endswith(".safetensors")):
            with safe_open(os.path.join(folder, shard), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118  (safe_open is not a dict: it cannot be iterated)
                    yield name, handle.get_tensor(name)

    try:
        for _ in verifier.wrap(shards_as_vllm_reads_them()):
            pass
        verifier.finish()
    finally:
        verifier.close()


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory):
    folder = write_checkpoint(tmp_path_factory.mktemp("loader") / "published")
    ckptpub.publish(folder)
    return folder


def run_audited(folder, options: Options | None = None) -> tuple[str, str | None, str, list[str]]:
    """Run the loader's checks on ``folder``: (outcome, key, refusal, paths opened outside the folder).

    A hang (a FIFO opened for reading) ends the run by SIGALRM and fails the test.
    """
    root = os.path.realpath(folder)
    outside: list[str] = []

    def audit(event: str, args: tuple) -> None:
        if (
            event == "open"
            and args
            and isinstance(args[0], (str, bytes))
            and not str(args[0]).endswith((".py", ".pyc", ".so"))
        ):
            path = os.fsdecode(args[0])
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            # O_NOFOLLOW opens no symlink in the last component: only the folder part resolves.
            real = (
                os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
                if flags & os.O_NOFOLLOW
                else os.path.realpath(path)
            )
            if not real.startswith(root + os.sep) and not real.startswith(NOT_CHECKPOINT_READS):
                outside.append(real)

    sys.addaudithook(audit)  # hooks cannot be removed; each records only into its own run's list
    key, message = None, ""
    try:
        with deadline(30, "the loader's checks"):
            key = load_like_the_engine(str(folder), options)
        outcome = "served"
    except RefusedError as error:
        message = str(error)
        assert "\n" not in message, message
        assert message.startswith("ckptpub: refusing"), message
        outcome = "refused"
    finally:
        watched, outside[:] = list(outside), []
    return outcome, key, message, watched


@pytest.mark.parametrize("case", LOADER_CASES, ids=[c.name for c in LOADER_CASES])
def test_loader_refuses_exactly_what_it_must(tmp_path, published, case):
    folder = tmp_path / "ckpt"
    shutil.copytree(published, folder, symlinks=True)
    if not case.published:
        (folder / ckptpub.MANIFEST_NAME).unlink()
    case.damage(folder)
    outcome, key, _, outside = run_audited(folder)
    assert outcome == ("served" if case.name in SERVED else "refused"), case.name
    if outcome == "served":
        assert key == ckptpub.read_manifest(folder).identity
    assert outside == [], f"{case.name}: opened outside the folder: {outside}"


@pytest.fixture(scope="module")
def engine_published(tmp_path_factory: pytest.TempPathFactory):
    folder = write_checkpoint(tmp_path_factory.mktemp("engine") / "published")
    add_engine_files(folder)
    ckptpub.publish(folder)
    return folder


@pytest.mark.parametrize("case", ENGINE_CASES, ids=[c.name for c in ENGINE_CASES])
def test_engine_start_checks_refuse_every_hostile_engine_file_and_manifest_path(
    tmp_path, engine_published, case
):
    folder = tmp_path / "ckpt"
    shutil.copytree(engine_published, folder, symlinks=True)
    identity = ckptpub.read_manifest(folder).identity
    case.damage(folder)
    extra = {k: identity if v == PIN else v for k, v in case.options.items()}
    outcome, _, message, outside = run_audited(folder, split_extra_config(extra)[0])
    assert outcome == ("served" if case.served else "refused"), (case.name, message)
    assert case.message in message, (case.name, message)
    assert outside == [], f"{case.name}: opened outside the folder: {outside}"
