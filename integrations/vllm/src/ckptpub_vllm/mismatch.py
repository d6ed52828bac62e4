"""When the weight-cache daemon holds something else: both sides, in the engine's one line.

vLLM's daemon answers a key that differs with ``{"status": "mismatch", "fields":
[...]}`` only, so an engine could say which fields differ but not what the daemon
holds. The plugin's daemon wrapper answers ``ckptpub_held`` with the key it holds
and the folder it loaded (``daemon_serving``); the engine asks once, after a
mismatch, and names both values of every field that differs: for ``checkpoint``,
the identity it asked for and the identity the daemon holds.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .daemon_reports import HELD_COMMAND


def ask_held(loader: Any) -> dict[str, Any] | None:
    """The daemon's answer to ``ckptpub_held`` (``key``, ``folder``), or None when it gives none.

    Through vLLM's own connection (its socket path and owner checks) and framing.
    """
    from vllm.model_executor.model_loader.weight_cache import protocol

    try:
        with loader._connect(loader.connect_timeout_s) as conn:
            protocol.send_msg(conn, {"cmd": HELD_COMMAND})
            reply = protocol.recv_msg(conn)
    except (protocol.WeightCacheUnavailableError, OSError, EOFError, ValueError):
        return None
    if not isinstance(reply, dict) or reply.get("status") != "ok" or not isinstance(reply.get("key"), dict):
        return None
    return reply


def describe(asked: Any, held: dict[str, Any] | None, vllm_says: str) -> str:
    """What differs between the key ``asked`` for and the daemon's (``held``, from :func:`ask_held`)."""
    if held is None:
        return f"{vllm_says}; the daemon does not say what it holds (not started with the ckptpub plugin?)"
    key = held["key"]
    differ = [f.name for f in dataclasses.fields(asked) if key.get(f.name) != getattr(asked, f.name)]
    parts = []
    for name in differ or ["checkpoint"]:
        ours, theirs = getattr(asked, name), key.get(name)
        if name == "checkpoint":
            where = f" (loaded from {held['folder']})" if isinstance(held.get("folder"), str) else ""
            parts.append(f"the daemon holds checkpoint {theirs}{where}, this engine asked for {ours}")
        else:
            parts.append(f"{name}: the daemon's is {theirs!r}, this engine's {ours!r}")
    return "; ".join(parts)
