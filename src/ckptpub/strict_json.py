"""Strict JSON reading shared by every parser of untrusted files (headers, manifests, configs).

Duplicate keys and NaN/Infinity are refused rather than silently resolved, so two
readers can never disagree about what a file says; sizes are bounded before reading.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .errors import CkptpubError


def loads_strict(data: bytes, display_name: str, what: str) -> Any:
    """Decode UTF-8 JSON ``data``; errors name ``display_name`` and ``what`` it was meant to be."""
    try:
        return json.loads(
            data.decode("utf-8"),
            object_pairs_hook=_reject_duplicate_keys,
            parse_constant=_reject_constant,
        )
    except UnicodeDecodeError:
        raise CkptpubError(f"{display_name}: {what} is not valid UTF-8") from None
    except (ValueError, RecursionError) as error:
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CkptpubError(f"{display_name}: {what} is not valid JSON: {detail}") from None


def read_bounded(path: str, limit: int, display_name: str) -> bytes:
    """Read a whole small file, refusing one larger than ``limit`` bytes before reading it."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > limit:
                raise CkptpubError(f"{display_name}: {size} bytes is over the {limit}-byte limit for this file")
            data = handle.read(limit + 1)
    except OSError as error:
        raise CkptpubError(f"{display_name}: cannot read: {error.strerror or error}") from None
    if len(data) > limit:
        raise CkptpubError(f"{display_name}: grew past the {limit}-byte limit while being read")
    return data


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"duplicate key {duplicate!r}")
    return result


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed")
