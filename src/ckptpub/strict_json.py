"""Strict JSON reading shared by every parser of untrusted files (headers, manifests, configs).

Duplicate keys, NaN/Infinity and numbers too large for a double (``1e400``) are
refused rather than silently resolved, so two readers can never disagree about what
a file says; sizes are bounded before reading.

Documents are decoded by CPython's C scanner (``_json.make_scanner``), the one
``json.loads`` itself runs, called directly: importing the ``json`` package costs
7 ms of every ``ckptpub`` start (it compiles regular expressions at import, which
imports ``re`` and ``enum``), 3% of verifying a 2 GB checkpoint. The grammar and
error messages are ``json.loads``'s; where ``_json`` is missing (not CPython),
``json.loads`` does the same work.
"""

from __future__ import annotations

import math
import os

from .errors import CkptpubError
from .safe_open import open_regular

try:
    from _json import make_scanner as _make_c_scanner
except ImportError:  # pragma: no cover - CPython always has it
    _make_c_scanner = None

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see records.py)
if TYPE_CHECKING:
    from typing import Any


def loads_strict(data: bytes, display_name: str, what: str) -> Any:
    """Decode UTF-8 JSON ``data``; errors name ``display_name`` and ``what`` it was meant to be."""
    try:
        text = data.decode("utf-8")
        value = _decode(text)
    except UnicodeDecodeError:
        raise CkptpubError(f"{display_name}: {what} is not valid UTF-8") from None
    except (ValueError, RecursionError) as error:
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CkptpubError(f"{display_name}: {what} is not valid JSON: {detail}") from None
    if ("\\ud" in text or "\\uD" in text) and _has_lone_surrogate(value):
        raise CkptpubError(
            f"{display_name}: {what} holds a lone surrogate escape (\\ud800-\\udfff), not Unicode text"
        )
    return value


def _has_lone_surrogate(value: Any) -> bool:
    """Whether any string (key or value) in a decoded document is not encodable text; iterative, so any depth."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


def read_bounded(path: str, limit: int, display_name: str, expect: tuple[int, int] | None = None) -> bytes:
    """Read a whole small regular file, refusing one larger than ``limit`` bytes before reading it.

    Opened as ``safe_open.open_regular`` opens (no symlink, no FIFO, the file the scan saw).
    """
    fd, info = open_regular(path, display_name, expect)
    try:
        with os.fdopen(fd, "rb") as handle:
            size = info.st_size
            if size > limit:
                raise CkptpubError(
                    f"{display_name}: {size} bytes is over the {limit}-byte limit for this file"
                )
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


def _finite_float(text: str) -> float:
    """A JSON number as a double, refusing one too large for it (``1e400`` would be Infinity)."""
    value = float(text)
    if value in (math.inf, -math.inf):
        raise ValueError(f"number {text} is out of range")
    return value


class _StrictSettings:
    """What ``json.loads(text, object_pairs_hook=..., parse_constant=...)`` hands its C scanner."""

    strict = True  # no raw control characters inside strings
    object_hook = None
    parse_float = staticmethod(_finite_float)
    parse_int = int
    object_pairs_hook = staticmethod(_reject_duplicate_keys)
    parse_constant = staticmethod(_reject_constant)


def _decode(text: str) -> Any:
    """``json.loads`` with the strict settings, without importing ``json`` unless the text is bad."""
    if _make_c_scanner is None:  # pragma: no cover - CPython always has _json
        import json

        return json.loads(
            text,
            object_pairs_hook=_reject_duplicate_keys,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
        )
    if text.startswith("\ufeff"):
        raise _error("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    try:
        value, end = _make_c_scanner(_StrictSettings)(text, _skip_whitespace(text, 0))
    except StopIteration as stop:
        raise _error("Expecting value", text, stop.value) from None
    end = _skip_whitespace(text, end)
    if end != len(text):
        raise _error("Extra data", text, end)
    return value


def _skip_whitespace(text: str, position: int) -> int:
    return len(text) - len(text[position:].lstrip(" \t\n\r"))  # in C: a hostile file may be all spaces


def _error(message: str, text: str, position: int) -> ValueError:
    """What ``json.loads`` raises here: "Expecting value: line 1 column 1 (char 0)"."""
    from json import JSONDecodeError

    return JSONDecodeError(message, text, position)
