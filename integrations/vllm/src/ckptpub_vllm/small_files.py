"""Check what an engine reads besides the tensor data: configs, tokenizer, templates, shard headers.

Streaming verification covers every tensor, but vLLM also reads ``config.json``,
``generation_config.json``, tokenizer files and chat templates from the folder, and
a same-size edit of one of them (a changed ``rope_theta``) would serve a different
model under the manifest's identity. They are small, so each top-level file the
manifest lists, other than safetensors shards and up to ``MAX_BYTES``, is hashed
whole and compared with its recorded digest, and each weight shard's header is
hashed (a damaged header is then refused by name, not by a parser deep in vLLM).
The config's meaning must also be the one the identity was computed from, so a
manifest whose config digest was forged is refused too. Larger files (optimizer
state) are never read by an engine and are left to ``ckptpub verify``.
"""

from __future__ import annotations

import json
import os

import ckptpub

from .errors import RefusedError

MAX_BYTES = 16 << 20


#: The safetensors format's own bound on a header (8-byte length prefix included).
MAX_HEADER_BYTES = 100_000_008


def changed_small_files(folder: str, manifest: "ckptpub.Manifest") -> list[str]:
    """Small top-level files and weight-shard headers whose bytes differ from the manifest."""
    changed = []
    weights = set(manifest.weights)
    for record in manifest.files:
        if record.path in weights and record.header_size is not None:
            limit, what = min(record.header_size, MAX_HEADER_BYTES), "header"
        elif "/" in record.path or record.header_size is not None or record.size > MAX_BYTES:
            continue
        else:
            limit, what = MAX_BYTES, "bytes"
        try:
            with open(os.path.join(folder, record.path), "rb") as handle:
                data = handle.read(limit + (what == "bytes"))
        except OSError as error:
            changed.append(f"{record.path} cannot be read ({error.strerror or error})")
            continue
        if ckptpub.tensor_digest(data) != record.digest:
            changed.append(f"{record.path}: {what} differ from the manifest")
        elif record.path in manifest.config and _config_meaning(data) != manifest.config[record.path]:
            changed.append(f"{record.path}: the manifest records another config meaning (forged manifest?)")
    return changed


def _config_meaning(data: bytes) -> str | None:
    """The config digest of ``data``, or None for a config no manifest can record.

    That covers text that is not a JSON object and values canonical JSON cannot
    write (NaN, or ``1e400`` read as Infinity): a forged manifest may list such a
    config with matching bytes, and it must be refused like any other mismatch.
    """
    try:
        document = json.loads(data)
        return ckptpub.config_digest(document) if isinstance(document, dict) else None
    except ValueError:
        return None


def check_small_files(folder: str, manifest: "ckptpub.Manifest") -> None:
    changed = changed_small_files(folder, manifest)
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise RefusedError(f"ckptpub: refusing {folder}: {changed[0]}{more}; run `ckptpub verify {folder}`")
