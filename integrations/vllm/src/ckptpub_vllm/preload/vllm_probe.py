"""What the default daemon command needs from this machine, asked once before the first daemon starts.

    python -m ckptpub_vllm.preload.vllm_probe [SOCKET_DIR]

Prints one JSON object: ``{"ok": true}`` or ``{"ok": false, "reason": "..."}``. It runs
where the daemons run (the supervisor's interpreter and environment, as
``{python}`` in the default daemon command does) and asks vLLM itself, so its answer
is the daemon's: vLLM and its weight cache import; the platform can share weights
with engines (vLLM's ``check_ipc_platform_support``: CUDA IPC); the longest socket
path a daemon binds there (the draft role's, in ``SOCKET_DIR`` or vLLM's default
folder) fits the AF_UNIX limit. Each of these fails every retry the same way, so
``ckptpub preload`` stops at once with the reason instead of backing off forever.
"""

from __future__ import annotations

import json
import sys

from .vllm_launcher import vllm_version_lookup

#: ``sun_path``'s usable size on Linux.
AF_UNIX_MAX = 107


def probe(socket_dir: str | None) -> str | None:
    """Why a daemon cannot serve engines here, or None when it can."""
    vllm_version_lookup()
    try:
        from vllm.model_executor.model_loader.weight_cache import protocol
    except Exception as error:  # noqa: BLE001 - any import failure is the answer
        return f"the daemon cannot import vLLM's weight cache: {type(error).__name__}: {error}"
    try:
        protocol.check_ipc_platform_support()
    except protocol.UnsupportedPlatformForIPCError as error:
        return f"this platform cannot share weights with engines: {error}"
    longest = protocol.get_socket_path("probe", socket_dir, is_draft=True)
    if len(longest.encode()) > AF_UNIX_MAX:
        return (
            f"vLLM's socket paths in {protocol.get_socket_dir(socket_dir)} would be {len(longest.encode())} "
            f"bytes, over the AF_UNIX limit of {AF_UNIX_MAX}; give a shorter --socket-dir (or TMPDIR)"
        )
    return None


def main(argv: list[str]) -> int:
    reason = probe(argv[0] if argv else None)
    print(json.dumps({"ok": reason is None, "reason": reason}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
