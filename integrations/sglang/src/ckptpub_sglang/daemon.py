"""SGLang's weight-cache daemons with the plugin, however they start.

SGLang loads its general plugins in the engine, scheduler, detokenizer and data-parallel
controller, never in a weight-cache daemon: a daemon started by
``python -m sglang.srt.weight_cache.daemon``, or spawned by an engine in
``--weight-cache-mode daemon`` (``spawn_weight_cache_daemon``, a fresh interpreter of the
``spawn`` method), builds SGLang's own key and would fail closed against every engine
that has the plugin. So:

* ``python -m ckptpub_sglang.daemon ARGS`` is the launcher: it loads the plugins, then
  does what SGLang's ``python -m sglang.srt.weight_cache.daemon ARGS`` does, with
  SGLang's own argument parsing and functions;
* ``spawn_weight_cache_daemon`` is replaced (in the launcher and in every engine that
  loaded the plugin) by :func:`spawn`, whose child runs :func:`run_daemon`: the plugins
  first, then SGLang's ``run_weight_cache_daemon``;
* both check that the plugin's key is in force after ``load_plugins`` (SGLang logs and
  skips a plugin that failed, or one ``SGLANG_PLUGINS`` leaves out) and exit with one
  line otherwise, before touching a GPU: a daemon keyed by path would serve nobody that
  has the plugin, after holding a GPU's worth of weights;
* ``WeightCacheDaemon.load`` runs inside ``decision.checked`` (:func:`load`): the key the
  daemon serves under and the verified disk load that fills it use one manifest.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable
from typing import Any

from . import key
from .decision import checked

#: SGLang's daemon start and load, replaced or wrapped here.
SPAWN_TARGET = "sglang.srt.weight_cache.daemon.spawn_weight_cache_daemon"
LOAD_TARGET = "sglang.srt.weight_cache.daemon.WeightCacheDaemon.load"


def load(original: Callable[..., Any], cache_daemon: Any) -> Any:
    """The AROUND hook of :data:`LOAD_TARGET`."""
    with checked(cache_daemon.model_path, cache_daemon.revision):
        return original(cache_daemon)


def load_plugins() -> None:
    """SGLang's ``load_plugins``; exits (code 2, one line) unless the plugin's key is in force after it."""
    from sglang.srt import plugins
    from sglang.srt.weight_cache import protocol

    plugins.load_plugins()
    if protocol.CacheConfig is not key.config_class():
        print(
            "ckptpub: the ckptpub SGLang plugin is not loaded in this weight-cache daemon "
            "(see SGLANG_PLUGINS and the log above): refusing to start a daemon that no engine with the "
            "plugin could use",
            file=sys.stderr,
        )
        sys.exit(2)


def run_daemon(
    server_args: Any, gpu_id: int, tp_rank: int, pp_rank: int, dist_init_method: str | None
) -> None:
    """A daemon child: the plugins, then SGLang's daemon (its path is what ``spawn`` pickles)."""
    from sglang.srt.weight_cache import daemon

    load_plugins()
    daemon.run_weight_cache_daemon(server_args, gpu_id, tp_rank, pp_rank, dist_init_method)


def spawn(server_args: Any, *, gpu_id: int, tp_rank: int, pp_rank: int, dist_init_method: str) -> Any:
    """The replacement of :data:`SPAWN_TARGET`: SGLang's, with :func:`run_daemon` as the child."""
    process = multiprocessing.get_context("spawn").Process(
        target=run_daemon, args=(server_args, gpu_id, tp_rank, pp_rank, dist_init_method)
    )
    process.start()
    return process


def main(argv: list[str] | None = None) -> None:
    """``python -m ckptpub_sglang.daemon``: SGLang's daemon command, with the plugins loaded."""
    import argparse

    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.weight_cache import daemon
    from sglang.srt.weight_cache.protocol import cleanup_stale_daemon_files

    load_plugins()
    parser = argparse.ArgumentParser(add_help=False)
    daemon.WeightCacheDaemonArgs.add_cli_args(parser)
    ours, theirs = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    server_args = prepare_server_args(theirs)
    args = daemon.WeightCacheDaemonArgs.from_cli_args(ours)
    if args.gpu_id is None and args.tp_rank is None:
        daemon.launch_weight_cache_daemons(
            server_args, dist_init_method=args.dist_init_method, timeout=args.timeout, force=args.force
        )
        return
    gpu_id = args.gpu_id if args.gpu_id is not None else args.tp_rank
    tp_rank = args.tp_rank if args.tp_rank is not None else args.gpu_id
    from sglang.srt.platforms import current_platform

    cleanup_stale_daemon_files(current_platform.get_device_uuid(gpu_id), force=args.force)
    daemon.run_weight_cache_daemon(server_args, gpu_id, tp_rank, args.pp_rank, args.dist_init_method)


if __name__ == "__main__":
    main()
