"""A real tensor-parallel vLLM CPU engine (TP=2, two worker processes): each tensor hashed once.

One ``run_engine.py`` process runs the four engines (``distributed_executor_backend="mp"``,
``VLLM_CPU_OMP_THREADS_BIND="0|1"``, the tiny Qwen3 with 2 attention and 2 KV heads, so
each rank holds one head): ``auto`` for the reference tokens, ``manifest_cache`` on the
published checkpoint, and two copies with one tensor zeroed, the first a tensor rank 0
hashes, the second one rank 1 hashes (by the plan every rank computes,
``ckptpub.distributed.assign``). Nothing is mocked.
"""

from __future__ import annotations

import re

import pytest
from support.vllm_engine_helpers import run_engines  # noqa: E402

import ckptpub  # noqa: E402
from ckptpub.distributed import assign  # noqa: E402

pytestmark = pytest.mark.slow  # vLLM engines of two worker processes

TP_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}


def hashed_by(folder: str) -> dict[int, list[str]]:
    """Which tensors each of two ranks that see every tensor hashes, as the plan assigns them."""
    manifest = ckptpub.read_manifest(folder)
    sizes = {t.name: t.data_offsets[1] - t.data_offsets[0] for t in manifest.tensors}
    names = sorted(sizes)
    owners = assign([sizes[name] for name in names], [0, 1])
    return {rank: [n for n, o in zip(names, owners, strict=True) if o == rank] for rank in (0, 1)}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[dict[str, dict], str, dict[int, str]]:
    from support.safetensors_files import copy_with_zeroed_tensor
    from support.tiny_model import build_tiny_qwen3

    root = tmp_path_factory.mktemp("tp")
    model = build_tiny_qwen3(str(root / "model"), heads=2, kv_heads=2, max_shard_size="150KB")
    ckptpub.publish(model)
    owners = hashed_by(model)
    changed = {
        rank: owners[rank][-1] for rank in (0, 1)
    }  # the smallest each hashes: a norm, not a projection
    jobs = {
        "auto": (model, "auto"),
        "manifest": (model, "manifest_cache"),
        **{
            f"changed{rank}": (
                copy_with_zeroed_tensor(model, str(root / f"changed{rank}"), name),
                "manifest_cache",
            )
            for rank, name in changed.items()
        },
    }
    results, log = run_engines(
        [{"model": m, "load_format": f, "tensor_parallel_size": 2} for m, f in jobs.values()],
        env=TP_ENV,
        timeout=1200,
    )
    return dict(zip(jobs, results, strict=True)), log, changed


def test_tokens_equal_auto_and_each_rank_hashes_its_share(served) -> None:
    results, log, _ = served
    assert "tokens" in results["manifest"], results["manifest"]
    assert results["manifest"]["tokens"] == results["auto"]["tokens"]
    shares = {
        int(rank): (int(mine), int(total))
        for rank, mine, total in re.findall(
            r"Worker_TP(\d) .*ckptpub: loaded and verified (\d+) of (\d+) tensors", log
        )
    }
    assert sorted(shares) == [0, 1], log[-3000:]
    assert shares[0][1] == shares[1][1] == 25
    assert shares[0][0] + shares[1][0] == 25
    assert min(shares[0][0], shares[1][0]) > 0


@pytest.mark.parametrize("rank", [0, 1])
def test_a_changed_tensor_is_refused_on_both_ranks_whichever_hashes_it(served, rank: int) -> None:
    results, log, changed = served
    name = changed[rank]
    assert "tokens" not in results[f"changed{rank}"], results[f"changed{rank}"]
    assert (
        "error" in results[f"changed{rank}"]
    )  # vLLM's words ("WorkerProc initialization failed"); ours below
    refusals = re.findall(r"Worker_TP(\d) .*(ckptpub: refusing to serve .*)", log)
    found = [
        line
        for tp, line in refusals
        if int(tp) == rank and f"{name!r} differs" in line and "refused:" not in line
    ]
    told = [
        line
        for tp, line in refusals
        if int(tp) == 1 - rank and f"rank {rank} of the 2 loading this model refused" in line
    ]
    assert found, refusals
    assert told, refusals  # the other rank refused too, with the finder's reason
    assert all(f"tensor {name!r} differs" in line for line in told), told
