"""One rank's parallel state, simulated for tests/sglang (SGLang reads it from its distributed state, set
up on the GPU), and the weight-cache key SGLang builds for that rank: the same on both sides of the socket."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

#: What ``get_parallel()`` answers for a single rank.
PARALLEL = SimpleNamespace(
    tp_size=1,
    tp_rank=0,
    pp_size=1,
    pp_rank=0,
    moe_ep_size=1,
    moe_dp_size=1,
    moe_dp_rank=0,
    moe_ep_rank=0,
    dp_size=1,
    attn_dp_size=1,
    enable_dp_lm_head=False,
    attn_cp_size=1,
    moe_dense_tp_size=None,
)
#: What ``get_exec()`` answers (the MoE all-to-all backend, unused by a dense model).
EXEC = SimpleNamespace(moe=SimpleNamespace(moe_a2a_backend="none"))


def cache_key(key_class: Any, model_path: str, model_config: Any) -> Any:
    """The key ``WeightCacheDaemon.load`` and ``IpcModelLoader._fetch_from_cache`` build for one rank of an
    unquantized model, of ``key_class`` (the plugin's ``CacheConfig`` or SGLang's own)."""
    from sglang.srt.weight_cache.protocol import compute_env_stamp

    p = PARALLEL
    return key_class(
        model_path=model_path,
        model_arch=model_config.hf_config.architectures[0],
        tp_size=p.tp_size,
        tp_rank=p.tp_rank,
        pp_size=p.pp_size,
        pp_rank=p.pp_rank,
        dp_size=p.dp_size,
        ep_size=p.moe_ep_size,
        moe_dp_size=p.moe_dp_size,
        moe_dp_rank=p.moe_dp_rank,
        moe_ep_rank=p.moe_ep_rank,
        attn_dp_size=p.attn_dp_size,
        enable_dp_lm_head=p.enable_dp_lm_head,
        attn_cp_size=p.attn_cp_size,
        moe_dense_tp_size=p.moe_dense_tp_size,
        moe_a2a_backend=EXEC.moe.moe_a2a_backend,
        quant_method="",
        quant_config_hash="",
        dtype=str(model_config.dtype),
        revision=model_config.revision or "",
        **compute_env_stamp(),
    )
