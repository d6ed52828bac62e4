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

For a model in object storage vLLM hands ``hash_checkpoint`` its local copy of the small
files (``shared.object_store``), whose ``ckptpub.json`` may be stale. Such a model is keyed
only inside ``checked``, by the manifest its loader or daemon read with one GET from the
bucket; outside it the copy is refused, never keyed by its pulled manifest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import ckptpub
from ckptpub import serving
from ckptpub.serving import RefusedError
from ckptpub.signing import TrustedKey

from .log import logger
from .object_store import is_pulled_copy

_PATCH_MARK = "_ckptpub_original"
_logged: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Checked:
    """The manifest this process already read and checked for a model (None: it has none), and the
    folder it was read from (``ckptpub.serving.model_folder``: a hub id's snapshot is resolved once, too)."""

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


def trusted_from_env(folder: str, kind: str = "") -> TrustedKey | None:
    """The key the environment trusts (``CKPTPUB_PUBLIC_KEY``/``CKPTPUB_CERTIFICATE_CHAIN``), for processes
    that see no engine option; both set is a refusal of ``folder`` (``kind``): fail closed."""
    try:
        return TrustedKey.from_environment()
    except ckptpub.CkptpubError as error:
        raise RefusedError(folder, f"a signed checkpoint is required: {error}", kind=kind) from None


def read_folder_manifest(
    folder: str, kind: str = "", *, check_tables: bool = True
) -> ckptpub.Manifest | None:
    """The folder's manifest as the environment trusts it (``ckptpub.serving.read_folder_manifest``);
    None only when nothing is at its manifest path. ``kind`` names what the folder holds in a refusal
    (``adapter``; a model by default)."""
    trusted = trusted_from_env(folder, kind)
    return serving.read_folder_manifest(folder, trusted, kind=kind, check_tables=check_tables)


def checkpoint_key(model: str) -> str | None:
    """Drop-in replacement for vLLM's ``protocol.hash_checkpoint``: the manifest's identity, or vLLM's
    own hash for a folder without a manifest that the environment's policy lets through.

    Inside ``checked``, the decision already made; otherwise the core's one decision
    (``ckptpub.serving.trusted_model``) under the environment's policy
    (``Policy.from_environment``: a flag that is neither on nor off, or two trusted keys,
    is a refusal: fail closed), reading the manifest's first line only.
    """
    identity: str | None = None
    decided = _checked.get(model) if isinstance(model, str) else None
    if decided is not None:
        identity = None if decided.manifest is None else decided.manifest.identity
    elif isinstance(model, str):
        if is_pulled_copy(model):
            raise RefusedError(
                model,
                "vLLM's copy of an object-store model's files, whose ckptpub.json may be stale, is keyed "
                "only by the manifest in the bucket",
                hint="serve it with --load-format manifest_cache",
            )
        try:
            policy = serving.Policy.from_environment()
        except ckptpub.CkptpubError as error:
            raise RefusedError(model, str(error)) from None
        # a policy that needs a manifest refuses a hub id not in the cache as such (the commands to run),
        # not as a folder without one
        strict = policy.require_manifest or policy.trusted is not None
        folder = serving.model_folder(model) if strict else folder_of(model)
        found = serving.trusted_model(model, policy=policy, folder=folder, check_tables=False)
        identity = found.cache_key
    if identity is None:
        return original_hash_checkpoint()(model)
    if (model, identity) not in _logged:
        _logged.add((model, identity))
        logger.info("ckptpub: weight-cache key for %s is its manifest identity %s", model, identity)
    return identity


def folder_of(model: str, revision: str | None = None) -> str:
    """The folder whose manifest speaks for ``model``: as ``ckptpub.serving.model_folder`` finds it, or
    ``model`` itself when that finds none, so an engine or daemon that does not ask for ``manifest_cache``
    keeps vLLM's own behaviour (``hash_checkpoint`` is handed the model alone: the default revision)."""
    try:
        return serving.model_folder(model, revision)
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
