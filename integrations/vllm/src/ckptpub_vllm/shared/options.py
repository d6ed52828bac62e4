"""Options of ``--load-format manifest_cache``, taken out of ``--model-loader-extra-config``.

vLLM's ``IpcModelLoader`` rejects extra-config keys it does not know, so ours are
popped first and everything else (``socket_path``, ``socket_dir``, ``mode``,
``fallback``, ``connect_timeout_s``, ``state_timeout_s``) is handed on unchanged.

``--load-format manifest_cache`` asks for the manifest's guarantee, so a folder
without ``ckptpub.json`` is refused unless ``require_manifest`` is set to false.
Environment: ``CKPTPUB_REQUIRE_MANIFEST=1`` also fails closed in processes that never
see this extra config: plain ``ipc_cache`` engines and ``vllm preload`` daemons.

The ``adapter_*`` options apply to the LoRA adapters the engine serves (``worker.adapters``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ckptpub import CkptpubError
from ckptpub.integration import REQUIRE_MANIFEST_ENV, check_identity, env_flag
from ckptpub.signing import TrustedKey

#: The ``--load-format`` name this plugin registers (``worker.loader``) and every layer checks for.
LOAD_FORMAT = "manifest_cache"
#: Disk formats a weight-cache daemon of a published folder loads through ``manifest_cache`` instead.
PLAIN_FORMATS = ("auto", "safetensors", "hf")


def unverified_daemon_load(load_format: str, extra_config: object) -> str | None:
    """How a daemon of a published folder would load unverified bytes, in words; None when it would not.

    Its key is the manifest's identity, so what it holds must be verified to be the
    identity's: ``manifest_cache`` verifies, and a plain format without extra config is
    switched to it (``daemon``). Any other format, or a plain one with
    ``--model-loader-extra-config`` (options of vLLM's own loader, which ``manifest_cache``
    does not take), would not verify: the daemon refuses it, and ``ckptpub preload``
    refuses such arguments before its first daemon (the one rule for both).
    """
    if load_format == LOAD_FORMAT or (load_format in PLAIN_FORMATS and not extra_config):
        return None
    return f"--load-format {load_format}" + (" with --model-loader-extra-config" if extra_config else "")


def require_manifest_from_env() -> bool:
    """Whether ``CKPTPUB_REQUIRE_MANIFEST`` asks every process to refuse folders without a manifest.

    The core's flag rule (``env_flag``): a value that is neither on nor off is a
    ``CkptpubError``, so a typo fails closed instead of serving unverified folders.
    """
    return env_flag(REQUIRE_MANIFEST_ENV)


@dataclass(frozen=True)
class Options:
    """``verify``: hash every tensor read from disk and refuse on any difference.
    ``require_manifest``: refuse folders without ``ckptpub.json`` (on by default;
    ignored when ``expect_identity`` is set, which always needs a manifest).
    ``hash_threads``: threads hashing tensors while vLLM copies them into the model.
    ``max_pending_mib``: bytes of tensors waiting for a hash before loading pauses.
    ``expect_identity``: refuse unless the manifest's identity is this one. Pinned
    from somewhere the checkpoint's writers cannot change, it turns "matches its
    manifest" into "is this model" (a manifest is not a signature).
    ``public_key`` (a PEM file) or ``certificate_chain`` (PEM files): refuse unless
    ``model.sig`` signs exactly this manifest with that key (see ``signature``);
    adapters then need a signature by that key too.
    ``adapter_require_manifest``: refuse adapters without ``ckptpub.json`` (on by
    default; false serves them unverified, with a warning, unless one is pinned).
    ``adapter_base_check``: refuse an adapter whose manifest records another base
    identity than the served base's (on by default; false serves it with a warning).
    ``adapter_identities``: ``{name or path: identity}`` in the extra config (kept as
    sorted pairs), an expected identity per adapter, matched by the adapter's name
    and by its folder; checked like ``expect_identity``.
    ``share_hashing``: when several ranks of one node load the model, each hashes a
    share of the tensors (``worker.node_share``); false: every rank hashes every tensor it
    reads itself (the ranks still agree on the outcome).
    """

    verify: bool = True
    require_manifest: bool = True
    hash_threads: int = 2
    max_pending_mib: int = 2048
    expect_identity: str | None = None
    public_key: str | None = None
    certificate_chain: tuple[str, ...] = ()
    adapter_require_manifest: bool = True
    adapter_base_check: bool = True
    adapter_identities: tuple[tuple[str, str], ...] = ()
    share_hashing: bool = True

    @property
    def trusted(self) -> TrustedKey | None:
        """The key to check signatures with, or None when neither option is set (``TrustedKey.of``)."""
        return TrustedKey.of(self.public_key, self.certificate_chain)


_KEYS = {f.name: f.type for f in fields(Options)}


def split_extra_config(extra: Mapping[str, Any] | None) -> tuple[Options, dict[str, Any]]:
    """Return (our options, the remaining keys for vLLM's IPC loader)."""
    try:  # an engine with a CKPTPUB_REQUIRE_MANIFEST it cannot read refuses to start, as for a bad option
        require_manifest_from_env()
    except CkptpubError as error:
        raise ValueError(str(error)) from None
    rest = dict(extra or {})
    values: dict[str, Any] = {}
    for name in _KEYS:
        if name not in rest:
            continue
        value = rest.pop(name)
        default = getattr(Options, name)
        if name == "expect_identity":
            _check_identity(value, "manifest_cache option 'expect_identity'")
        elif name == "adapter_identities":
            value = _adapter_identities(value)
        elif name == "public_key":
            if not (isinstance(value, str) and value):
                raise ValueError(
                    f"manifest_cache option 'public_key' must be a PEM file's path, got {value!r}"
                )
        elif name == "certificate_chain":
            value = [value] if isinstance(value, str) else value
            if not (isinstance(value, list) and value and all(isinstance(v, str) and v for v in value)):
                raise ValueError(
                    f"manifest_cache option 'certificate_chain' must be a PEM path or a list, got {value!r}"
                )
            value = tuple(value)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"manifest_cache option {name!r} must be true or false, got {value!r}")
        elif not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"manifest_cache option {name!r} must be a positive integer, got {value!r}")
        values[name] = value
    return Options(**values), rest


def _check_identity(value: object, what: str) -> None:
    try:
        check_identity(value, what)
    except CkptpubError as error:  # vLLM reports a bad option as a ValueError, like the others here
        raise ValueError(str(error)) from None


def _adapter_identities(value: object) -> tuple[tuple[str, str], ...]:
    """``adapter_identities`` as sorted ``(name or path, identity)`` pairs, once each is valid."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
        raise ValueError(
            "manifest_cache option 'adapter_identities' must map adapter names or paths to identities, "
            f"got {value!r}"
        )
    for key, identity in value.items():
        _check_identity(identity, f"manifest_cache option 'adapter_identities' for {key!r}")
    return tuple(sorted(value.items()))
