"""``--load-format manifest_cache``: vLLM's IPC loader, keyed and verified by the manifest.

:class:`ManifestCacheLoader` subclasses vLLM's ``IpcModelLoader``. On a CUDA host it
asks the weight-cache daemon for the weights; the key's ``checkpoint`` field is the
manifest identity (see ``key``), so the daemon maps them only when it holds exactly
these bytes. Whenever weights come from disk instead (no daemon, a mismatch with
``fallback``, a platform without CUDA IPC such as the CPU build, or a daemon loading
its own copy through ``load_weights``), :class:`VerifyingDiskLoader` streams them
through a :class:`StreamVerifier` and the engine refuses to start on any difference.
Before anything, the folder's files are compared with the manifest by ``stat``.
"""

from __future__ import annotations

import dataclasses
import time

from torch import nn
from vllm.config import ModelConfig, VllmConfig
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
from vllm.model_executor.model_loader.weight_cache import protocol
from vllm.model_executor.model_loader.weight_cache.ipc_loader import IpcModelLoader

import ckptpub

from . import LOAD_FORMAT
from .errors import RefusedError
from .key import load_manifest
from .log import logger
from .options import Options, split_extra_config
from .small_files import check_small_files
from .staleness import check_not_stale
from .verify_stream import StreamVerifier


class VerifyingDiskLoader(DefaultModelLoader):
    """vLLM's default disk loader with every tensor of the main checkpoint verified."""

    def __init__(self, load_config: LoadConfig, manifest: "ckptpub.Manifest | None", options: Options) -> None:
        super().__init__(load_config)
        self.manifest = manifest
        self.options = options
        self.verifier: StreamVerifier | None = None
        self._folder: str | None = None

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        if self.manifest is None or not self.options.verify:
            if self.manifest is not None:
                logger.warning("ckptpub: loading %s from disk WITHOUT verification (verify=false)", model_config.model)
            super().load_weights(model, model_config)
            return
        self._folder = model_config.model
        self.verifier = StreamVerifier(model_config.model, self.manifest, threads=self.options.hash_threads,
                                       max_pending_mib=self.options.max_pending_mib)
        start = time.perf_counter()
        try:
            super().load_weights(model, model_config)
            if self.local_expert_ids is not None:
                self.verifier.mark_partial("expert-parallel weight filter")
            self.verifier.finish()
        except RefusedError as e:
            logger.error("%s", e)
            raise
        finally:
            self.verifier.close()
        v = self.verifier
        logger.info(
            "ckptpub: loaded and verified %d tensors (%.2f GiB) of %s from disk in %.2f s; identity %s",
            v.verified_tensors, v.verified_bytes / 2**30, model_config.model, time.perf_counter() - start,
            self.manifest.identity,
        )

    def _get_weights_iterator(self, source):
        weights = super()._get_weights_iterator(source)
        if self.verifier is None:
            return weights
        if source.model_or_path != self._folder or source.prefix or source.subfolder:
            logger.warning("ckptpub: weights from %s (prefix %r) are not covered by the manifest",
                           source.model_or_path, source.prefix)
            return weights
        if source.is_unused_weight is not None or self._encoder_only_lm_prefixes is not None:
            self.verifier.mark_partial("vLLM skips shards this model does not use")
        return self.verifier.wrap(weights)


def ipc_unsupported_reason() -> str | None:
    """Why this platform cannot map a daemon's weights, or None when it can.

    Asks vLLM's own ``protocol.check_ipc_platform_support``, looked up on the module
    at call time, so the loader takes the daemon path exactly where vLLM's
    ``IpcModelLoader`` would (and where a platform shim says it may).
    """
    try:
        protocol.check_ipc_platform_support()
    except protocol.UnsupportedPlatformForIPCError as error:
        return str(error)
    return None


class ManifestCacheLoader(IpcModelLoader):
    """Loader of ``--load-format manifest_cache`` (options: see ``options.Options``)."""

    def __init__(self, load_config: LoadConfig) -> None:
        self.options, rest = split_extra_config(load_config.model_loader_extra_config)
        super().__init__(dataclasses.replace(load_config, model_loader_extra_config=rest))
        self._manifest: ckptpub.Manifest | None = None

    # -- the manifest, checked once per load -------------------------------------------
    def _prepare(self, model_config: ModelConfig) -> "ckptpub.Manifest | None":
        folder = model_config.model
        manifest = load_manifest(folder)
        if manifest is None:
            if self.options.require_manifest:
                raise RefusedError(f"ckptpub: refusing {folder}: no {ckptpub.MANIFEST_NAME} and "
                                   f"require_manifest is set (publish it with `ckptpub publish {folder}`)")
            logger.warning("ckptpub: %s has no %s; vLLM's own key and an unverified load apply",
                           folder, ckptpub.MANIFEST_NAME)
            return None
        expected = self.options.expect_identity
        if expected is not None and manifest.identity != expected:
            raise RefusedError(f"ckptpub: refusing {folder}: its identity {manifest.identity} is not the expected {expected}")
        if self.options.stat_check:
            check_not_stale(folder, manifest)
        if self.options.verify:
            check_small_files(folder, manifest)
        logger.info("ckptpub: requested %s, identity %s", folder, manifest.identity)
        self._manifest = manifest
        return manifest

    def _disk_loader(self, manifest: "ckptpub.Manifest | None") -> VerifyingDiskLoader:
        return VerifyingDiskLoader(self._fallback_load_config(), manifest, self.options)

    # -- vLLM's entry points ---------------------------------------------------------------
    def get_external_weight_memory(self, vllm_config: VllmConfig) -> int:
        if ipc_unsupported_reason() is not None:
            return 0
        return super().get_external_weight_memory(vllm_config)

    def load_model(self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str = "") -> nn.Module:
        manifest = self._prepare(model_config)
        no_ipc = ipc_unsupported_reason()
        if no_ipc is not None:
            if not self.fallback:
                raise RefusedError(f"ckptpub: refusing {model_config.model}: fallback is false but there is no "
                                   f"daemon to map from: {no_ipc}")
            logger.info("ckptpub: no daemon to map from (%s); loading %s from disk%s", no_ipc, model_config.model,
                        " with verification" if manifest is not None and self.options.verify else "")
            return self._disk_loader(manifest).load_model(vllm_config=vllm_config, model_config=model_config,
                                                          prefix=prefix)
        return super().load_model(vllm_config, model_config, prefix)

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        """Used by the weight-cache daemon (and reloads): always a verified disk load."""
        manifest = self._prepare(model_config)
        self._disk_loader(manifest).load_weights(model, model_config)

    def _request_state(self, cache_config):
        logger.info("ckptpub: asking the weight-cache daemon for checkpoint %s", cache_config.checkpoint)
        try:
            state = super()._request_state(cache_config)
        except protocol.CacheConfigMismatchError as e:
            logger.warning("ckptpub: the daemon holds something else (%s); it will not be mapped", e)
            raise
        logger.info("ckptpub: the daemon holds %s: mapping its weights", cache_config.checkpoint)
        return state

    def _fallback_load(self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str) -> nn.Module:
        manifest = self._manifest if self._manifest is not None else self._prepare(model_config)
        logger.info("ckptpub: loading %s from disk%s", model_config.model,
                    " with verification" if manifest is not None and self.options.verify else "")
        return self._disk_loader(manifest).load_model(vllm_config=vllm_config, model_config=model_config,
                                                      prefix=prefix)


def install() -> None:
    """Register ``manifest_cache`` with vLLM (idempotent, no warning on repeat)."""
    from vllm.model_executor import model_loader

    if model_loader._LOAD_FORMAT_TO_MODEL_LOADER.get(LOAD_FORMAT) is ManifestCacheLoader:
        return
    model_loader.register_model_loader(LOAD_FORMAT)(ManifestCacheLoader)
