"""``--load-format manifest_cache``: vLLM's IPC loader, keyed and verified by the manifest.

:class:`ManifestCacheLoader` subclasses vLLM's ``IpcModelLoader``. On a CUDA host it
asks the weight-cache daemon for the weights; the key's ``checkpoint`` field is the
manifest identity (see ``shared.key``), so the daemon maps them only when it holds exactly
these bytes. Whenever weights come from disk instead (no daemon, a mismatch with
``fallback``, a platform without CUDA IPC such as the CPU build, or a daemon loading
its own copy through ``load_weights``), :class:`VerifyingDiskLoader` streams them
through a :class:`TensorVerifier` and the engine refuses to start on any difference,
in the one pass vLLM makes over the shards anyway; for a model in object storage
(``s3://``), :class:`VerifyingStreamLoader` does the same over vLLM's own object-store
streamer, against the manifest read from the bucket (``shared.object_store``). Before either,
``shared.startup.check_before_start`` reads the manifest and checks the files the engine
reads itself; it opens no shard, so an engine start that maps a daemon's weights
costs the same few filesystem requests for 16 shards or 163. With LoRA enabled the
loaded model is marked as served by ``manifest_cache``, so its adapters are checked
(``adapters``).

When the daemon holds something else, vLLM's daemon answers a key that differs with
``{"status": "mismatch", "fields": [...]}`` only, so an engine could say which fields
differ but not what the daemon holds. The plugin's daemon wrapper answers
``ckptpub_held`` with the key it holds and the folder it loaded (``daemon.serving``);
the loader asks once, after a mismatch, and names both values of every field that
differs in its one line (:func:`describe_mismatch`): for ``checkpoint``, the identity
it asked for and the identity the daemon holds.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from vllm.config import ModelConfig, VllmConfig
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
from vllm.model_executor.model_loader.runai_streamer_loader import RunaiModelStreamerLoader
from vllm.model_executor.model_loader.weight_cache import protocol
from vllm.model_executor.model_loader.weight_cache.ipc_loader import IpcModelLoader

import ckptpub
from ckptpub.serving import RefusedError, check_shards_are_files

from ..shared import daemon_reports, key
from ..shared.daemon_reports import HELD_COMMAND
from ..shared.log import logger
from ..shared.object_store import STREAMER, locate, object_store_url
from ..shared.options import LOAD_FORMAT, Options, split_extra_config
from ..shared.refusals import refusals_logged
from ..shared.startup import check_before_start
from . import adapters, node_share
from .verify_stream import TensorVerifier


class _VerifiedLoad:
    """What both verifying loaders do around their vLLM base loader's ``load_model``/``load_weights``.

    Tensors are hashed on a few threads as vLLM streams them into the model. In a full
    ``load_model`` the last hashes are awaited only after vLLM's weight post-processing,
    so they overlap it instead of delaying it: on real shapes the hashing costs more CPU
    than the copy it runs beside. The model is returned only once every tensor verified;
    a refusal discards it. A bare ``load_weights`` (the weight-cache daemon's) waits for
    its hashes before returning. A subclass wraps its base's weight iterator in
    ``self.verifier``.
    """

    def __init__(
        self, load_config: LoadConfig, manifest: ckptpub.Manifest | None, options: Options, folder: str
    ) -> None:
        super().__init__(load_config)  # type: ignore[call-arg]  # the vLLM loader this is mixed into
        self.manifest = manifest
        self.options = options
        self.folder = folder  # where the checkpoint is: vLLM's model, a hub id's snapshot, an s3:// prefix
        self.verifier: TensorVerifier | None = None
        self._source: str | None = None
        self._started = 0.0
        self._finish_after_post_processing = False

    def load_model(self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str = "") -> nn.Module:
        self._finish_after_post_processing = True
        try:
            model: nn.Module = super().load_model(  # type: ignore[misc]
                vllm_config=vllm_config, model_config=model_config, prefix=prefix
            )
        except BaseException:
            if self.verifier is not None:
                self.verifier.close()
            raise
        finally:
            self._finish_after_post_processing = False
        if self.verifier is not None:
            self._finish_verification(model_config)
        return model

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        if self.manifest is None or not self.options.verify:
            if self.manifest is not None:
                logger.warning(
                    "ckptpub: loading %s from %s WITHOUT verification (verify=false)",
                    model_config.model,
                    self.reads_from(),
                )
            super().load_weights(model, model_config)  # type: ignore[misc]
            return
        self._source = model_config.model
        self._started = time.perf_counter()
        check_shards_are_files(self.folder)
        self.verifier = TensorVerifier(
            self.folder,
            self.manifest,
            threads=self.options.hash_threads,
            max_pending_mib=self.options.max_pending_mib,
            **self._verifier_arguments(),
        )
        try:
            super().load_weights(model, model_config)  # type: ignore[misc]
        except BaseException:
            self.verifier.close()
            raise
        self._loaded(self.verifier)
        if not self._finish_after_post_processing:
            self._finish_verification(model_config)

    def _verifier_arguments(self) -> dict[str, Any]:
        """This loader's own ``TensorVerifier`` arguments (the node's peers; private copies)."""
        return {}

    def reads_from(self) -> str:
        """Where the weights come from, in the log's words."""
        return "disk"

    def _loaded(self, verifier: TensorVerifier) -> None:
        """What the base loader's filters left out on purpose, told to ``verifier`` once the stream ended."""

    def _finish_verification(self, model_config: ModelConfig) -> None:
        """Wait for the last hashes (refusing on any difference) and say what was verified."""
        verifier = self.verifier
        assert verifier is not None
        assert self.manifest is not None
        verifier.finish()
        daemon_reports.report(
            daemon_reports.VERIFIED,
            folder=self.folder,
            identity=self.manifest.identity,
            tensors=verifier.verified_tensors,
            total=verifier.total_tensors,
            ranks=verifier.helpers,
        )
        others = verifier.helpers - 1
        logger.info(
            "ckptpub: loaded and verified %d of %d tensors (%.2f GiB here) of %s from %s in %.2f s%s; "
            "identity %s",
            verifier.verified_tensors,
            verifier.total_tensors,
            verifier.verified_bytes / 2**30,
            model_config.model,
            self.reads_from(),
            time.perf_counter() - self._started,
            f" (the rest by {others} other rank{'s' if others > 1 else ''} of this node)" if others else "",
            self.manifest.identity,
        )


class VerifyingDiskLoader(_VerifiedLoad, DefaultModelLoader):  # type: ignore[misc]  # vLLM is untyped here
    """vLLM's default disk loader with every tensor of the main checkpoint verified.

    When several ranks load the model (tensor, context or pipeline parallel: vLLM's
    groups), the ranks of one node split the hashing and agree on the outcome (``node_share``).
    """

    def _verifier_arguments(self) -> dict[str, Any]:
        return {"peers": node_share.peers_from_vllm(), "share_hashing": self.options.share_hashing}

    def _loaded(self, verifier: TensorVerifier) -> None:
        if self.local_expert_ids is not None:
            verifier.mark_partial("expert-parallel weight filter")

    def _get_weights_iterator(self, source: DefaultModelLoader.Source) -> Iterator[tuple[str, torch.Tensor]]:
        weights: Iterator[tuple[str, torch.Tensor]] = super()._get_weights_iterator(source)
        if self.verifier is None:
            return weights
        if source.model_or_path != self._source or source.prefix or source.subfolder:
            logger.warning(
                "ckptpub: weights from %s (prefix %r) are not covered by the manifest",
                source.model_or_path,
                source.prefix,
            )
            return weights
        if source.is_unused_weight is not None or self._encoder_only_lm_prefixes is not None:
            self.verifier.mark_partial("vLLM skips shards this model does not use")
            self.verifier.share(node_share.READS_UNKNOWN)  # which tensors it sees is vLLM's to say
        elif self.local_expert_ids is not None:
            self.verifier.share(node_share.READS_LISTED, expert_filter(self.local_expert_ids))
        else:
            self.verifier.share(node_share.READS_ALL)
        return self.verifier.wrap(weights)


class VerifyingStreamLoader(_VerifiedLoad, RunaiModelStreamerLoader):  # type: ignore[misc]  # vLLM is untyped
    """vLLM's object-store loader (runai-model-streamer) with every tensor verified as it streams.

    For a model in an ``s3://`` prefix (``folder``). The streamer yields each tensor as
    a clone, memory of its own, so that clone is what is hashed and what the model gets,
    with no second copy (``TensorVerifier(private=True)``). Every rank hashes all it
    streams: the node's ranks share the hashing of files, not of a bucket's objects.
    """

    def _verifier_arguments(self) -> dict[str, Any]:
        return {"private": True}

    def reads_from(self) -> str:
        return self.folder

    def _get_weights_iterator(
        self, model_or_path: str, revision: str | None, *more: Any
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """vLLM's stream of ``model_or_path``'s tensors, verified; ``more``: what newer vLLMs pass (0.33:
        ``is_unused_weight``, with which the streamer may skip shards the model does not use)."""
        weights: Iterator[tuple[str, torch.Tensor]] = super()._get_weights_iterator(
            model_or_path, revision, *more
        )
        if self.verifier is None:
            return weights
        if any(extra is not None for extra in more):
            self.verifier.mark_partial("vLLM skips shards this model does not use")
        return self.verifier.wrap(weights)


def expert_filter(local_expert_ids: set[int]) -> Callable[[str], bool] | None:
    """Whether this rank sees a tensor under expert parallelism: vLLM's own filter, or None (unknown)."""
    try:
        from vllm.model_executor.model_loader.ep_weight_filter import should_skip_weight
    except ImportError:  # another vLLM: this rank hashes all it sees and takes no share
        return None
    return lambda name: not should_skip_weight(name, local_expert_ids)


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


class ManifestCacheLoader(IpcModelLoader):  # type: ignore[misc]  # vLLM is untyped for mypy here
    """Loader of ``--load-format manifest_cache`` (options: see ``shared.options.Options``)."""

    def __init__(self, load_config: LoadConfig) -> None:
        self.options, rest = split_extra_config(load_config.model_loader_extra_config)
        super().__init__(dataclasses.replace(load_config, model_loader_extra_config=rest))
        self._manifest: ckptpub.Manifest | None = None
        self._folder = ""

    def _prepare(self, model_config: ModelConfig) -> ckptpub.Manifest | None:
        location = locate(model_config)
        self._folder = location.folder
        self._manifest = check_before_start(self._folder, self.options, location.copy)
        return self._manifest

    def _disk_loader(self, manifest: ckptpub.Manifest | None, model_config: ModelConfig) -> _VerifiedLoad:
        """The verified load from where the weights are: disk, or (an ``s3://`` model) vLLM's streamer."""
        if object_store_url(model_config) is not None:
            streamer = dataclasses.replace(
                self.load_config, load_format=STREAMER, model_loader_extra_config={}
            )
            return VerifyingStreamLoader(streamer, manifest, self.options, self._folder)
        return VerifyingDiskLoader(self._fallback_load_config(), manifest, self.options, self._folder)

    # -- vLLM's entry points ---------------------------------------------------------------
    def get_external_weight_memory(self, vllm_config: VllmConfig) -> int:
        if ipc_unsupported_reason() is not None:
            return 0
        memory: int = super().get_external_weight_memory(vllm_config)
        return memory

    def load_model(self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str = "") -> nn.Module:
        with refusals_logged(model_config.model):
            model = self._load_model(vllm_config, model_config, prefix)
        if vllm_config.lora_config is not None:
            adapters.serve_base(model, self._folder, self._manifest, self.options)
        return model

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        """Used by the weight-cache daemon (and reloads): always a verified disk load.

        In a daemon, against the manifest its key was computed from, in the folder it was
        read from (``daemon.run_daemon`` checked it and keeps it in force), never a second
        read of ``ckptpub.json`` nor a second resolution of a hub id.
        """
        with refusals_logged(model_config.model):
            decided = key.checked_for(model_config.model)
            if decided is None:
                self._prepare(model_config)
            else:
                self._folder, self._manifest = decided.folder, decided.manifest
            self._disk_loader(self._manifest, model_config).load_weights(model, model_config)

    def _load_model(self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str) -> nn.Module:
        manifest = self._prepare(model_config)
        no_ipc = ipc_unsupported_reason()
        if no_ipc is not None:
            if not self.fallback:
                raise RefusedError(
                    model_config.model, f"fallback is false but there is no daemon to map from: {no_ipc}"
                )
            return self._verified_load(
                manifest, vllm_config, model_config, prefix, f"no daemon to map from ({no_ipc}); "
            )
        with key.checked(model_config.model, manifest, self._folder):
            return super().load_model(vllm_config, model_config, prefix)

    def _request_state(self, cache_key: protocol.WeightCacheKey, **kwargs: Any) -> protocol.WeightCacheState:
        """Ask the daemon, logging the request and its answer; a mismatch is described, then refused or
        left to the fallback. ``kwargs`` carries what newer vLLMs add (0.33: ``is_reload``)."""
        logger.info("ckptpub: asking the weight-cache daemon for checkpoint %s", cache_key.checkpoint)
        try:
            state = super()._request_state(cache_key, **kwargs)
        except protocol.CacheConfigMismatchError as error:
            what = describe_mismatch(cache_key, ask_held(self), str(error))
            if not self.fallback:
                raise RefusedError(self._folder, f"{what}; fallback is false, so nothing is loaded") from None
            logger.warning("ckptpub: %s: not mapped; falling back to a verified disk load", what)
            raise
        logger.info("ckptpub: the daemon holds %s: mapping its weights", cache_key.checkpoint)
        return state

    def _fallback_load(self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str) -> nn.Module:
        manifest = self._manifest if self._manifest is not None else self._prepare(model_config)
        return self._verified_load(manifest, vllm_config, model_config, prefix)

    def _verified_load(
        self,
        manifest: ckptpub.Manifest | None,
        vllm_config: VllmConfig,
        model_config: ModelConfig,
        prefix: str,
        why: str = "",
    ) -> nn.Module:
        """The whole model loaded from disk or the bucket (``_disk_loader``), saying so first."""
        loader = self._disk_loader(manifest, model_config)
        logger.info(
            "ckptpub: %sloading %s from %s%s",
            why,
            model_config.model,
            loader.reads_from(),
            " with verification" if manifest is not None and self.options.verify else "",
        )
        model: nn.Module = loader.load_model(
            vllm_config=vllm_config, model_config=model_config, prefix=prefix
        )
        return model


def ask_held(loader: Any) -> dict[str, Any] | None:
    """The daemon's answer to ``ckptpub_held`` (``key``, ``folder``), or None when it gives none.

    Through vLLM's own connection (its socket path and owner checks) and framing.
    """
    try:
        with loader._connect(loader.connect_timeout_s) as conn:
            protocol.send_msg(conn, {"cmd": HELD_COMMAND})
            reply = protocol.recv_msg(conn)
    except (protocol.WeightCacheUnavailableError, OSError, EOFError, ValueError):
        return None
    if not isinstance(reply, dict) or reply.get("status") != "ok" or not isinstance(reply.get("key"), dict):
        return None
    return reply


def describe_mismatch(asked: Any, held: dict[str, Any] | None, vllm_says: str) -> str:
    """What differs between the key ``asked`` for and the daemon's (``held``, from :func:`ask_held`)."""
    if held is None:
        return f"{vllm_says}; the daemon does not say what it holds (not started with the ckptpub plugin?)"
    held_key = held["key"]
    differ = [f.name for f in dataclasses.fields(asked) if held_key.get(f.name) != getattr(asked, f.name)]
    parts = []
    for name in differ or ["checkpoint"]:
        ours, theirs = getattr(asked, name), held_key.get(name)
        if name == "checkpoint":
            where = f" (loaded from {held['folder']})" if isinstance(held.get("folder"), str) else ""
            parts.append(f"the daemon holds checkpoint {theirs}{where}, this engine asked for {ours}")
        else:
            parts.append(f"{name}: the daemon's is {theirs!r}, this engine's {ours!r}")
    return "; ".join(parts)


def install() -> None:
    """Register ``manifest_cache`` with vLLM (idempotent, no warning on repeat)."""
    from vllm.model_executor import model_loader

    if model_loader._LOAD_FORMAT_TO_MODEL_LOADER.get(LOAD_FORMAT) is ManifestCacheLoader:
        return
    model_loader.register_model_loader(LOAD_FORMAT)(ManifestCacheLoader)
