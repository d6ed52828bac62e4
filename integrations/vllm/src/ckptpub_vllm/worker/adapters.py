"""LoRA adapters inside the guarantee: what a ``manifest_cache`` engine checks before serving one.

vLLM reads an adapter's files in its workers, always in
``WorkerLoRAManager._load_adapter``: ``PEFTHelper.from_local_dir`` reads
``adapter_config.json``, then ``LoRAModel.from_local_checkpoint`` reads
``adapter_model.safetensors`` (``safetensors.safe_open``). Every path that asks for
an adapter ends there, in the worker:

==========================================  =================================================
vLLM path                                   how the worker gets to ``_load_adapter``
==========================================  =================================================
``LLM.generate(..., lora_request=...)``     the engine core's admission check
                                            (``engine_core.adapter_gate``), before the
                                            request is scheduled
``--lora-modules`` at server start,         ``add_lora`` (a failure fails that call: the
``POST /v1/load_lora_adapter``,             server does not start, the endpoint answers 500,
LoRA resolver plugins, ``add_lora()``       ``add_lora()`` raises), each with the refusal's line
a request for an adapter that vLLM's        the admission check again: re-read, and checked
CPU cache evicted (``max_cpu_loras``)       again, before the request is scheduled
==========================================  =================================================

What is checked there, each time vLLM reads an adapter, once the base of this
engine was loaded through ``manifest_cache`` (:func:`serve_base` marks the model;
an engine with any other load format loads adapters exactly as vLLM does):

1. the adapter folder's manifest: required unless ``adapter_require_manifest`` is
   false; signed by the engine's trusted key when one is set; its identity equal to
   an ``adapter_identities`` pin for the adapter's name or for its folder by any path
   (a folder is named by :func:`adapter_folder`, its symlinks resolved, wherever a pin
   or a record is looked up);
2. the base: the manifest's ``base_identity`` must be the identity of the base this
   engine serves (unless ``adapter_base_check`` is false); an adapter that records
   no base is served with one warning;
3. the bytes vLLM reads: ``adapter_config.json`` and ``adapter_model.safetensors``
   are each read once, whole, into memory (sizes from the manifest checked against
   the file before anything is allocated, no symlink out of the folder); the
   config's bytes and meaning and every tensor's name, dtype, shape and digest are
   compared with the manifest; then vLLM's own loading code runs with its two reads
   served from those bytes (``adapter_reads``), so every byte it puts into the model
   is a byte that was checked, whatever happens to the files meanwhile.

vLLM keys what a worker holds by LoRA id alone and never reads a held id again;
:func:`add_checked` wraps each add so that a held adapter answers only the requests
that name it (its folder and pins), and an add that fails leaves nothing of the id
behind (vLLM registers an adapter before it copies it into a slot, where a tensor of
another rank than its config says fails half-way). Each successful add is recorded
(:func:`loaded_adapters`, by LoRA id): what the server shows (``frontend.served``).

``adapter_model.bin``/``.pt`` adapters are pickles: ckptpub never unpickles, so
with a manifest required they are refused (with ``adapter_require_manifest`` false
and no manifest, vLLM loads them itself, outside the guarantee). A refusal is a
``RefusedError`` (``ckptpub: refusing to serve adapter DIR: REASON``), logged once here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import ckptpub
from ckptpub.errors import CkptpubError
from ckptpub.integration import ShardLayout, base_of, layout_in_memory
from ckptpub.serving import FileMismatchError, RefusedError, StreamVerifier, read_published, read_weights_file
from ckptpub.serving_torch import StagingBuffers, torch_dtype

from ..shared.log import logger
from ..shared.options import Options
from ..shared.refusals import refusals_logged
from ..shared.startup import checked_manifest
from . import adapter_reads
from .adapter_reads import CONFIG_FILE, WEIGHTS_FILE, VerifiedAdapter, served_from_memory

PICKLED_WEIGHTS = ("adapter_model.bin", "adapter_model.pt")
KIND = "adapter"
#: The attribute of the served model (the ``nn.Module`` vLLM's LoRA manager wraps) that marks it.
BASE_ATTR = "_ckptpub_base"


@dataclass(frozen=True)
class ServedBase:
    """The base model a ``manifest_cache`` engine serves, and the options its adapters are checked by."""

    folder: str
    identity: str | None  # None: served without a manifest (require_manifest false)
    options: Options


@dataclass(frozen=True)
class ServedAdapter:
    """What one load of an adapter put in a worker: the LoRA id and name it was asked under, the
    path it was asked by (``requested``), its folder (:func:`adapter_folder`), its identity and its base's.

    ``how`` (how it was checked, for the log) is left out of comparisons."""

    lora_id: int
    name: str
    requested: str
    path: str
    identity: str | None  # None: no manifest (adapter_require_manifest false)
    base_identity: str | None
    how: str = field(default="", compare=False)


#: The latest load of each LoRA id in this process, as it was added: what the server shows.
_loaded: dict[int, ServedAdapter] = {}
_warned: set[tuple[str, str]] = set()
#: The attribute of a loaded ``LoRAModel`` holding its :class:`ServedAdapter`.
RECORD_ATTR = "_ckptpub_loaded"
#: An adapter's tensors go to the hash pool in runs of about this many bytes, as they are read.
HASH_RUN_BYTES = 8 << 20
#: The memory adapters' weight files are read into: vLLM's ``LoRAModel`` holds views of it (on a
#: CPU host; on a GPU host it copies them), and an adapter vLLM dropped (its CPU cache evicted it)
#: leaves its buffer to the next load, already touched; a load keeps at most twice its own size of
#: such buffers for the next. Adapters load on the worker's one thread.
_weight_buffers = StagingBuffers(keep_bytes=0)


def adapter_folder(path: str) -> str:
    """The one name of an adapter folder: the folder ``path`` leads to, every symlink resolved.

    Pins and records are looked up by it, so every path to a folder (a symlink to it,
    a symlinked parent, ``..``, ``~``) meets the same pin and the same record.
    """
    return os.path.realpath(os.path.expanduser(path))


def loaded_adapters() -> tuple[ServedAdapter, ...]:
    """The latest load of each LoRA id in this process (oldest id first)."""
    return tuple(_loaded[lora_id] for lora_id in sorted(_loaded))


def record_of(lora: Any) -> ServedAdapter | None:
    """The record :func:`load_checked` gave a loaded ``LoRAModel`` (None: not loaded by it)."""
    record: ServedAdapter | None = getattr(lora, RECORD_ATTR, None)
    return record


def serve_base(model: Any, folder: str, manifest: ckptpub.Manifest | None, options: Options) -> None:
    """Mark ``model`` as a base served by ``manifest_cache``: its adapters are checked from now on."""
    setattr(model, BASE_ATTR, ServedBase(folder, manifest.identity if manifest else None, options))
    install()


def check_adapter(folder: str, name: str, base: ServedBase) -> ckptpub.Manifest | None:
    """The manifest of the adapter at ``folder`` (a resolved :func:`adapter_folder`) once it, its pin
    and its base are right.

    None only when there is no manifest and ``adapter_require_manifest`` is false
    (after a warning). Refuses otherwise (``RefusedError``). Reads ``ckptpub.json`` only.
    """
    options = base.options
    pins = pins_for(name, folder, options)
    if len(pins) > 1:
        raise RefusedError(folder, f"it is pinned to two identities: {', '.join(pins)}", kind=KIND)
    manifest = checked_manifest(
        folder,
        options,
        expected=pins[0] if pins else None,
        require=options.adapter_require_manifest,
        publish=f"ckptpub publish {folder} --base {base.folder}",
        opt_out="adapter_require_manifest",
        unverified="vLLM loads it unverified",
        kind=KIND,
    )
    if manifest is not None:
        check_base(folder, manifest, base)
    return manifest


def pins_for(name: str, folder: str, options: Options) -> list[str]:
    """The ``adapter_identities`` pins of the adapter ``name`` at ``folder``: by its name, or by any
    path to its folder (both sides resolved by :func:`adapter_folder`), sorted, each once."""
    real = adapter_folder(folder)
    return sorted(
        {
            identity
            for key, identity in options.adapter_identities
            if key == name or adapter_folder(key) == real
        }
    )


def check_base(folder: str, manifest: ckptpub.Manifest, base: ServedBase) -> None:
    """Refuse an adapter trained on another base than the served one (see ``adapter_base_check``)."""
    recorded = base_of(manifest)
    served = base.identity or f"unknown (its folder {base.folder} has no {ckptpub.MANIFEST_NAME})"
    if recorded is None:
        _warn_once(
            folder,
            manifest.identity,
            "ckptpub: adapter %s (identity %s) records no base identity, so its base is not checked; "
            "it is applied on %s (publish it with --base to record its base)",
            folder,
            manifest.identity,
            served,
        )
        return
    if recorded == base.identity:
        return
    if not base.options.adapter_base_check:
        _warn_once(
            folder,
            manifest.identity,
            "ckptpub: adapter %s was trained on base %s but is applied on %s, as adapter_base_check is false",
            folder,
            recorded,
            served,
        )
        return
    raise RefusedError(
        folder,
        f"it was trained on base {recorded}, but this engine serves base {served}",
        hint=f"serve it on its own base; if it was trained on this one, published again since (a manifest of "
        f"an older format has another identity), publish the adapter again with `ckptpub publish {folder} "
        f"--base {base.folder}`; or set adapter_base_check to false",
        kind=KIND,
    )


def _warn_once(folder: str, identity: str, message: str, *args: object) -> None:
    if (folder, identity) not in _warned:
        _warned.add((folder, identity))
        logger.warning(message, *args)


def read_checked(folder: str, manifest: ckptpub.Manifest, options: Options) -> VerifiedAdapter:
    """Read ``adapter_config.json`` and the weights once each, and check them against ``manifest``."""
    records = {record.path: record for record in manifest.files}
    if WEIGHTS_FILE not in manifest.weights:
        pickled = [p for p in PICKLED_WEIGHTS if p in records or os.path.lexists(os.path.join(folder, p))]
        why = f"; {pickled[0]} is a pickle, which ckptpub never loads: save the adapter as safetensors"
        reason = f"{WEIGHTS_FILE} is not in the manifest{why if pickled else ''}"
        raise RefusedError(folder, reason, kind=KIND)
    config_record = records.get(CONFIG_FILE)
    if config_record is None:
        raise RefusedError(folder, f"{CONFIG_FILE} is not in the manifest, and vLLM reads it", kind=KIND)
    try:
        config = read_published(folder, config_record, manifest)
    except FileMismatchError as problem:
        raise RefusedError(folder, str(problem), hint=f"run `ckptpub verify {folder}`", kind=KIND) from None
    tensors = _checked_tensors(folder, records[WEIGHTS_FILE], manifest, options)
    return VerifiedAdapter(folder, manifest, config, tensors)


def _checked_tensors(
    folder: str, record: ckptpub.FileRecord, manifest: ckptpub.Manifest, options: Options
) -> dict[str, torch.Tensor]:
    """The weight file's tensors, as views of the one read of it, each checked against the manifest.

    The read is the private copy: the bytes hashed are the bytes of the tensors vLLM
    gets, with no second copy. They are hashed while the rest of the file is read
    (:class:`_CheckedRead`).
    """
    _weight_buffers.keep_bytes = 2 * record.size
    verifier = StreamVerifier(
        folder,
        manifest,
        threads=options.hash_threads,
        max_pending_bytes=options.max_pending_mib << 20,
        kind=KIND,
    )
    try:
        read = _CheckedRead(verifier)
        try:
            read_weights_file(folder, record, read.allocate, read.arrived)
            read.arrived(record.size)
        except CkptpubError as error:
            raise RefusedError(folder, str(error), kind=KIND) from None
        verifier.finish()
    finally:
        verifier.close()
    return read.tensors


class _CheckedRead:
    """One read of an adapter's weight file into reused memory (``_weight_buffers``), checked as it arrives.

    Once the header is in, every tensor's name, dtype and shape are checked and its
    view made; as the read goes on, the tensors whose bytes have all arrived are handed
    to the verifier in runs of :data:`HASH_RUN_BYTES` (an adapter is hundreds of tensors
    of a few hundred KiB: handing each to the hash pool alone costs as much as hashing it).
    """

    def __init__(self, verifier: StreamVerifier) -> None:
        self.verifier = verifier
        self.tensors: dict[str, torch.Tensor] = {}
        self._buffer = torch.empty(0, dtype=torch.uint8)
        self._data = memoryview(b"")
        self._layout: ShardLayout | None = None
        self._next = 0  # the first tensor not yet handed to the verifier
        self._run: list[tuple[str, memoryview]] = []
        self._run_bytes = 0

    def allocate(self, size: int) -> memoryview:
        """The memory the file is read into (asked once its size is checked)."""
        self._buffer = _weight_buffers.lend(size)
        self._data = memoryview(self._buffer.numpy())
        return self._data

    def arrived(self, count: int) -> None:
        """The first ``count`` bytes of the file are in: check and hash what they complete."""
        if self._layout is None:
            if count < len(self._data) and count < 8 + int.from_bytes(self._data[:8], "little"):
                return  # the header is not all in yet (at the end, a bad length is refused here)
            self._layout = layout_in_memory(self._data, WEIGHTS_FILE)
            self._admit(self._layout)
        entries, base = self._layout.tensors, self._layout.header_size
        while self._next < len(entries) and base + entries[self._next].end <= count:
            entry = entries[self._next]
            self._run.append((entry.name, self._data[base + entry.begin : base + entry.end]))
            self._run_bytes += entry.end - entry.begin
            self._next += 1
            if self._run_bytes >= HASH_RUN_BYTES or self._next == len(entries):
                self.verifier.hash_together(self._run)
                self._run, self._run_bytes = [], 0

    def _admit(self, layout: ShardLayout) -> None:
        """Check every tensor's name, dtype and shape, and make the views vLLM will get."""
        for entry in layout.tensors:
            dtype = torch_dtype(entry.dtype)
            if dtype is None:
                raise self.verifier.refuse(
                    f"tensor {entry.name!r} has dtype {entry.dtype}, which torch lacks"
                )
            self.verifier.expect(entry.name, entry.dtype, entry.shape)
            start, end = layout.header_size + entry.begin, layout.header_size + entry.end
            self.tensors[entry.name] = _view(self._buffer, start, end, dtype).reshape(entry.shape)


def _view(data: torch.Tensor, start: int, end: int, dtype: torch.dtype) -> torch.Tensor:
    """The bytes ``[start, end)`` of ``data`` (``uint8``) as a flat tensor: a view, or a copy where
    they are unaligned."""
    if start % dtype.itemsize:
        return data[start:end].clone().view(dtype)
    return data[start:end].view(dtype)


def load_checked(lora_request: Any, base: ServedBase, load: Callable[[Any], Any]) -> Any:
    """vLLM's ``load`` of ``lora_request`` (a ``LoRARequest``), on checked bytes only.

    The folder is checked and read by its :func:`adapter_folder`; vLLM's two reads, by the
    path it names the folder with, are served from those bytes. The loaded ``LoRAModel``
    carries its :class:`ServedAdapter` (:func:`record_of`), recorded once it is added.
    """
    from vllm.exceptions import LoRAAdapterNotFoundError
    from vllm.lora.utils import get_adapter_absolute_path

    name = lora_request.lora_name
    requested = get_adapter_absolute_path(lora_request.lora_path)
    if not os.path.isdir(requested):
        raise LoRAAdapterNotFoundError(name, lora_request.lora_path)
    folder = adapter_folder(requested)
    started = time.perf_counter()
    manifest = check_adapter(folder, name, base)
    if manifest is None or not base.options.verify:
        if manifest is not None:
            logger.warning("ckptpub: loading adapter %s WITHOUT verification (verify=false)", folder)
        lora = load(lora_request)
        identity = manifest.identity if manifest is not None else None
        return _recorded(lora, lora_request, folder, identity, base, "UNVERIFIED")
    adapter = read_checked(folder, manifest, base.options)
    with served_from_memory(adapter, requested):
        lora = load(lora_request)
    if not (adapter.config_read and adapter.tensors_read):
        unread = CONFIG_FILE if not adapter.config_read else WEIGHTS_FILE
        reason = f"vLLM read it without going through ckptpub's check of {unread}"
        raise RefusedError(folder, reason, kind=KIND)
    how = (
        f"verified {len(adapter.tensors)} tensors ({adapter.size / 2**20:.1f} MiB) "
        f"in {time.perf_counter() - started:.2f} s"
    )
    return _recorded(lora, lora_request, folder, manifest.identity, base, how)


def _recorded(lora: Any, request: Any, folder: str, identity: str | None, base: ServedBase, how: str) -> Any:
    record = ServedAdapter(
        request.lora_int_id, request.lora_name, request.lora_path, folder, identity, base.identity, how
    )
    setattr(lora, RECORD_ATTR, record)
    return lora


def add_checked(manager: Any, lora_request: Any, base: ServedBase, add: Callable[[Any], bool]) -> bool:
    """vLLM's ``add`` of ``lora_request`` to ``manager`` (a ``WorkerLoRAManager``), held or loaded.

    vLLM keys what a worker holds by LoRA id alone: a held adapter answers for the
    request only if it is the one the request names (:func:`check_held`). An add that
    fails (a refused read, or vLLM's own failure once it registered the adapter, such
    as a tensor of another rank than its config says, which leaves a half-written
    slot) leaves nothing of the id behind, so the next request reads and checks the
    folder again instead of using what is left. A successful add is recorded.
    """
    models = manager._adapter_manager
    lora_id = lora_request.lora_int_id
    held = models.get_adapter(lora_id)
    if held is not None and not lora_request.load_inplace:
        with refusals_logged():  # (a refused load is logged where it is found, in the load)
            check_held(record_of(held), lora_request, base)
    try:
        loaded = add(lora_request)
    except BaseException:
        models.remove_adapter(lora_id)
        _loaded.pop(lora_id, None)
        raise
    record = record_of(models.get_adapter(lora_id))
    if record is not None and _loaded.get(lora_id) != record:
        _loaded[lora_id] = record
        logger.info(
            "ckptpub: serving adapter %r from %s, identity %s, %s; base identity %s",
            record.name,
            record.path,
            record.identity or "unknown (no manifest)",
            record.how,
            record.base_identity or "unknown (no manifest)",
        )
    return loaded


def check_held(record: ServedAdapter | None, lora_request: Any, base: ServedBase) -> None:
    """Refuse ``lora_request`` unless the adapter held under its LoRA id (``record``) is the one it names:
    the same folder (:func:`adapter_folder`), and no pin of the request's name that differs."""
    from vllm.lora.utils import get_adapter_absolute_path

    if record is not None and (record.name, record.requested) == (
        lora_request.lora_name,
        lora_request.lora_path,
    ):
        return
    lora_id = lora_request.lora_int_id
    folder = adapter_folder(get_adapter_absolute_path(lora_request.lora_path))
    if record is None or record.path != folder:
        held = f"adapter {record.name!r} from {record.path}" if record else "an adapter ckptpub did not load"
        raise RefusedError(
            folder,
            f"LoRA id {lora_id} already holds {held}, which vLLM would answer with",
            hint="give each adapter folder its own lora_int_id",
            kind=KIND,
        )
    other = [pin for pin in pins_for(lora_request.lora_name, folder, base.options) if pin != record.identity]
    if other:
        raise RefusedError(
            folder,
            f"LoRA id {lora_id} holds it with identity {record.identity or 'unknown (no manifest)'}, "
            f"not the expected {other[0]}",
            kind=KIND,
        )


_PATCH_MARK = "_ckptpub_original"
#: The worker method the server calls (``collective_rpc``) to show what its workers loaded.
LOADED_METHOD = "ckptpub_loaded_adapters"


def _loaded_rows(worker: Any) -> list[list[Any]]:
    """What :data:`LOADED_METHOD` answers: :func:`loaded_adapters` as plain rows (they cross processes)."""
    return [[a.lora_id, a.name, a.requested, a.path, a.identity, a.base_identity] for a in loaded_adapters()]


def install() -> None:
    """Route vLLM's adapter loads through :func:`load_checked`, and its adds through
    :func:`add_checked`, in this process (idempotent); give its workers :data:`LOADED_METHOD`.

    Each checks only a base marked by :func:`serve_base`; others load as in vLLM.
    """
    from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager, WorkerLoRAManager
    from vllm.v1.worker.worker_base import WorkerBase

    original = WorkerLoRAManager._load_adapter
    if getattr(original, _PATCH_MARK, None) is not None:
        return

    def _load_adapter(self: Any, lora_request: Any) -> Any:
        base = getattr(self._adapter_manager.model, BASE_ATTR, None)
        if base is None:  # not a base loaded by manifest_cache: vLLM's own load
            return original(self, lora_request)
        with refusals_logged():
            return load_checked(lora_request, base, lambda request: original(self, request))

    setattr(_load_adapter, _PATCH_MARK, original)
    adapter_reads.install()
    for manager in (WorkerLoRAManager, LRUCacheWorkerLoRAManager):
        manager.add_adapter = _adding_checked(vars(manager)["add_adapter"])
    setattr(WorkerBase, LOADED_METHOD, _loaded_rows)
    WorkerLoRAManager._load_adapter = _load_adapter


def _adding_checked(original: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def add_adapter(self: Any, lora_request: Any) -> bool:
        base = getattr(self._adapter_manager.model, BASE_ATTR, None)
        if base is None:
            return original(self, lora_request)
        return add_checked(self, lora_request, base, lambda request: original(self, request))

    setattr(add_adapter, _PATCH_MARK, original)
    return add_adapter
