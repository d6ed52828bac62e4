"""A real vLLM CPU engine with ``public_key`` set: it serves the signed checkpoint and nothing else.

One ``run_engine.py`` subprocess runs every case (vLLM imported once, in-process engine
cores). Nothing of vLLM is mocked; the CPU build has no CUDA IPC, so after the
signature check the loader takes its disk path and verifies every tensor it streams.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from support.checkpoints import flip_byte, locate  # noqa: E402
from support.vllm_engine_helpers import run_engines  # noqa: E402

import ckptpub  # noqa: E402

pytestmark = pytest.mark.slow  # vLLM engines

TENSOR = "model.norm.weight"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, keys: dict) -> tuple[dict[str, dict], str]:
    from support.tiny_model import build_tiny_qwen3

    root = tmp_path_factory.mktemp("signed-engine")
    signed = Path(build_tiny_qwen3(str(root / "signed"), max_shard_size="150KB"))
    ckptpub.publish(signed, sign=keys["trainer"].private)

    def variant(name: str) -> Path:
        return Path(shutil.copytree(signed, root / name))

    blake3_signed = variant("blake3")  # the same weights, the signature listing BLAKE3 file digests
    ckptpub.publish(blake3_signed, sign=keys["trainer"].private, sign_hash="blake3")
    tensor = Path(shutil.copytree(blake3_signed, root / "tensor"))  # a changed tensor: refused either way
    shard, begin, _ = locate(tensor, TENSOR)
    flip_byte(shard, begin + 1)
    tokenizer = variant("tokenizer")
    text = (tokenizer / "tokenizer.json").read_bytes()  # one byte, still valid JSON: vLLM reads it itself
    (tokenizer / "tokenizer.json").write_bytes(text.replace(b"<|endoftext|>", b"<|endoftexT|>", 1))
    republished = variant("republished")
    shard, begin, _ = locate(republished, TENSOR)
    flip_byte(shard, begin + 1)
    ckptpub.publish(republished)
    unsigned = variant("unsigned")
    (unsigned / "model.sig").unlink()
    public = {"public_key": str(keys["trainer"].public)}
    jobs = {
        "auto": (signed, "auto", {}),
        "signed": (signed, "manifest_cache", public),
        "blake3": (blake3_signed, "manifest_cache", public),
        "tensor": (tensor, "manifest_cache", public),
        "tokenizer": (tokenizer, "manifest_cache", public),
        "republished": (republished, "manifest_cache", public),
        "unsigned": (unsigned, "manifest_cache", public),
        "stranger": (signed, "manifest_cache", {"public_key": str(keys["stranger"].public)}),
    }
    results, log = run_engines(
        [{"model": str(m), "load_format": f, "extra": extra} for m, f, extra in jobs.values()]
    )
    return dict(zip(jobs, results, strict=True)), log


@pytest.mark.parametrize("case", ["signed", "blake3"])
def test_the_signed_checkpoint_is_served_as_auto_serves_it(
    served: tuple[dict[str, dict], str], case: str
) -> None:
    """Signed with SHA-256 (the default) or BLAKE3 file digests: the key accepts both."""
    results, log = served
    assert "tokens" in results[case], results[case]
    assert results[case]["tokens"] == results["auto"]["tokens"]
    assert "ckptpub: loaded and verified" in log


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("tensor", f"{TENSOR}"),
        ("tokenizer", "tokenizer.json"),
        ("republished", "ckptpub.json: differs from the one signed"),
        ("unsigned", "no model.sig, so it is not signed"),
        ("stranger", "model.sig: signature does not verify"),
    ],
)
def test_every_change_is_refused(served: tuple[dict[str, dict], str], case: str, reason: str) -> None:
    results, _ = served
    error = results[case].get("error", "")
    assert "ckptpub: refusing to serve" in error, results[case]
    assert reason in error, error
    assert "tokens" not in results[case]
