"""The ``checkpoint`` field of vLLM's weight-cache key, taken from the manifest.

vLLM fills ``WeightCacheKey.checkpoint`` with ``protocol.hash_checkpoint(model)``, a
hash of every shard's *header* (names, dtypes, shapes, offsets; no values). Two
checkpoints with one layout and different weights get one key, so an engine asked
for a fine-tune silently maps the daemon's base model. ``from_model_config`` looks
``hash_checkpoint`` up in its module at call time, on the engine side
(``IpcModelLoader._fetch_entries``) and the daemon side (``WeightCacheDaemon.__init__``)
alike, so replacing that one module attribute changes both.

For a folder with ``ckptpub.json`` the replacement returns the manifest's identity
(``"blake3:<64 hex>"``, a hash of every tensor's bytes), reading that one small file
in a handful of filesystem requests and opening no shard. Anything at the manifest's
path that is not a valid manifest (a directory, a FIFO, a symlink, a damaged file) is
refused, never taken as "no manifest". Folders with nothing at that path keep vLLM's
own hash (plain ``ipc_cache`` users are unaffected) unless ``CKPTPUB_REQUIRE_MANIFEST=1``
asks to fail closed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import ckptpub
from ckptpub.integration import REQUIRE_MANIFEST_ENV, locate

from .errors import RefusedError
from .log import logger
from .options import require_manifest_from_env
from .signature import signed_manifest, trusted_from_env

_PATCH_MARK = "_ckptpub_original"
_logged: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Checked:
    """The manifest this process already read and checked for a model (None: it has none), and
    the folder it was read from (``model_folder``: a hub id's snapshot is resolved once, too)."""

    manifest: ckptpub.Manifest | None
    folder: str


#: Decisions in force, by the model vLLM names (see ``checked``).
_checked: dict[str, Checked] = {}


@contextlib.contextmanager
def checked(model: str, manifest: ckptpub.Manifest | None, folder: str | None = None) -> Iterator[None]:
    """While the block runs, ``model`` is keyed (and loaded) by the manifest already checked.

    The key then names exactly the manifest whose checks passed, and nothing reads
    ``ckptpub.json`` again in between: an engine asks the daemon inside this block,
    and a daemon runs its whole life inside it (``daemon.run_daemon``), so the key
    computed in vLLM's ``WeightCacheDaemon.__init__`` and the verified
    ``load_weights`` use the one object, and the one ``folder`` it was read from
    (``model`` itself by default; a hub id's snapshot otherwise). ``None`` keeps the
    decision "no manifest" (vLLM's own key) rather than reading again. Outside the
    block the key reads the file as usual.
    """
    previous = _checked.get(model)
    _checked[model] = Checked(manifest, model if folder is None else folder)
    try:
        yield
    finally:
        if previous is None:
            _checked.pop(model, None)
        else:
            _checked[model] = previous


def checked_for(model: str) -> Checked | None:
    """The decision ``checked`` put in force for ``model``, or None when there is none."""
    return _checked.get(model)


def model_folder(model: str, revision: str | None = None) -> str:
    """The folder vLLM's ``model`` names: that path when it exists (with ``HF_HUB_OFFLINE=1`` vLLM
    hands over a hub id's snapshot path), else the hub id's snapshot at ``revision`` in the Hugging
    Face cache, resolved offline by huggingface_hub (``ckptpub.integration.locate``). A hub id that is
    not in the cache is refused: nothing there could be checked."""
    if os.path.lexists(model):
        return model
    try:
        return locate(model, revision)
    except ckptpub.CkptpubError as error:
        raise RefusedError(model, str(error)) from None


def has_manifest(folder: str) -> bool:
    """Whether anything (a valid manifest or not) is at the folder's manifest path (one ``lstat``)."""
    return os.path.lexists(os.path.join(folder, ckptpub.MANIFEST_NAME))


def read_folder_manifest(
    folder: str, kind: str = "", *, check_tables: bool = True
) -> ckptpub.Manifest | None:
    """The folder's validated manifest; None only when nothing is at its manifest path.

    The manifest file is read directly (no separate look at the folder first); only
    when that fails does a ``lstat`` tell "absent" from "present but unusable".
    With ``CKPTPUB_PUBLIC_KEY``/``CKPTPUB_CERTIFICATE_CHAIN`` set (daemons, plain
    ``ipc_cache`` engines) only the manifest that key signed is returned. ``kind``
    names what the folder holds in a refusal (``adapter``; a model by default).
    ``check_tables=False``: the entries are checked when the tensors are first used
    (the key needs the identity alone, which commits to the model region's bytes).
    A manifest of an older format is refused with the core's one line (publish it again).
    """
    trusted = trusted_from_env(folder, kind)
    if trusted is not None:
        return signed_manifest(folder, trusted, kind)
    path = os.path.join(folder, ckptpub.MANIFEST_NAME)
    try:
        return ckptpub.read_manifest(path, check_tables=check_tables)
    except ckptpub.CkptpubError as error:
        if not os.path.lexists(path):
            return None
        raise RefusedError(folder, f"its {ckptpub.MANIFEST_NAME} is unusable: {error}", kind=kind) from None


def checkpoint_key(model: str) -> str | None:
    """Drop-in replacement for vLLM's ``protocol.hash_checkpoint``."""
    manifest = None
    decided = _checked.get(model) if isinstance(model, str) else None
    if decided is not None:
        manifest = decided.manifest
    elif isinstance(model, str):
        manifest = read_folder_manifest(folder_of(model), check_tables=False)
    if manifest is not None:
        if (model, manifest.identity) not in _logged:
            _logged.add((model, manifest.identity))
            logger.info(
                "ckptpub: weight-cache key for %s is its manifest identity %s", model, manifest.identity
            )
        return manifest.identity
    try:
        required = require_manifest_from_env()
    except ckptpub.CkptpubError as error:  # fail closed: a flag that is neither on nor off
        raise RefusedError(model, str(error)) from None
    if required:
        raise RefusedError(
            model,
            f"no {ckptpub.MANIFEST_NAME} and {REQUIRE_MANIFEST_ENV}=1",
            hint=f"publish it with `ckptpub publish {model}`",
        )
    return original_hash_checkpoint()(model)


def folder_of(model: str, revision: str | None = None) -> str:
    """The folder whose manifest speaks for ``model``: as ``model_folder`` finds it, or ``model`` itself
    when that finds none, so an engine or daemon that does not ask for ``manifest_cache`` keeps vLLM's
    own behaviour (``hash_checkpoint`` is handed the model alone: the default revision)."""
    try:
        return model_folder(model, revision)
    except RefusedError:
        return model


def original_hash_checkpoint() -> Callable[[str], str | None]:
    """vLLM's own ``hash_checkpoint``, whether or not the patch is installed."""
    from vllm.model_executor.model_loader.weight_cache import protocol

    current = protocol.hash_checkpoint
    original: Callable[[str], str | None] = getattr(current, _PATCH_MARK, current)
    return original


def _patched(model: str) -> str | None:
    return checkpoint_key(model)


def install() -> None:
    """Replace ``protocol.hash_checkpoint`` (idempotent; keeps vLLM's for fall back)."""
    from vllm.model_executor.model_loader.weight_cache import protocol

    current = protocol.hash_checkpoint
    if getattr(current, _PATCH_MARK, None) is not None:
        return
    setattr(_patched, _PATCH_MARK, current)
    protocol.hash_checkpoint = _patched
