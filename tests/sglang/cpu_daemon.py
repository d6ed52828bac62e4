"""SGLang 0.5.23's weight-cache daemon on this CPU, for tests/sglang: started as a script, one per test.

SGLang's own code: the plugin loaded as a daemon child of the plugin loads it
(``load_plugins``), the key (``CacheConfig``, replaced by the plugin), the disk loader's
weight stream (``DefaultModelLoader._get_weights_iterator``, verified by the plugin), the
``torch_ipc`` transport's export, and the serve loop with its comparison
(``WeightCacheDaemon.serve``, ``_handle_connection``) on a real Unix socket.

Simulated, because SGLang's daemon needs CUDA for them (``WeightCacheDaemon.load`` refuses
a platform that is not CUDA-alike): the device (``get_device_uuid``: the socket and ready
paths are given here), the parallel state (one rank: ``dp_size``, ``attn_dp_size``, the MoE
ranks ``load`` reads from ``get_parallel``), and the model built on the GPU from the
stream: the daemon serves the tensors SGLang's disk loader streams, as CPU tensors shared
through a file (torch's ``file_system`` strategy; on a GPU, CUDA IPC handles). ``load``
below stands in for SGLang's ``WeightCacheDaemon.load`` and is wrapped by the plugin's own
hook (``ckptpub_sglang.daemon.load``), as SGLang's is.

Usage: ``cpu_daemon.py MODEL SOCKET READY``; it serves until killed.
"""

from __future__ import annotations

import os
import sys

import torch.multiprocessing
from one_rank import cache_key
from sglang.srt.plugins import load_plugins


def load(daemon: object) -> None:
    """What ``WeightCacheDaemon.load`` does that runs on a CPU: the key, the disk stream, the export."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader
    from sglang.srt.weight_cache.daemon import CacheConfig
    from sglang.srt.weight_cache.transport import TorchIpcTransportBackend

    model_config = ModelConfig(model_path=daemon.model_path, revision=daemon.revision)
    daemon.config = cache_key(CacheConfig, daemon.model_path, model_config)  # as load() builds it
    loader = DefaultModelLoader(LoadConfig(load_format="safetensors"))
    stream = loader._get_weights_iterator(DefaultModelLoader.Source(daemon.model_path, daemon.revision))
    daemon.transport_backend = TorchIpcTransportBackend()
    daemon.state_entries = daemon.transport_backend.prepare_export(
        {name: (tensor, True) for name, tensor in stream}
    )


def main() -> None:
    model, socket_path, ready_path = sys.argv[1:]
    load_plugins()  # as ckptpub_sglang.daemon.run_daemon does first
    from ckptpub_sglang.daemon import load as plugin_load
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.weight_cache.daemon import WeightCacheDaemon

    torch.multiprocessing.set_sharing_strategy("file_system")
    runtime_context.publish(ServerArgs(model_path=model, device="cpu"), role="weight_cache_daemon")
    daemon = WeightCacheDaemon.__new__(WeightCacheDaemon)  # __init__ asks the GPU for its UUID
    daemon.model_path, daemon.revision, daemon.gpu_id = model, None, 0
    daemon.socket_path, daemon.ready_path = socket_path, ready_path
    daemon.preloaded_weights_bytes = 0
    plugin_load(load, daemon)
    print(f"daemon {os.getpid()} serving {daemon.config.model_path}", flush=True)
    daemon.serve()


if __name__ == "__main__":
    main()
