"""Strict JSON reading shared by every parser of untrusted files (headers, manifests, configs).

``json.loads`` with hooks that refuse what it would otherwise resolve silently, so two
readers can never disagree about what a file says: duplicate keys (``object_pairs_hook``),
NaN and Infinity (``parse_constant``), numbers too large for a double such as ``1e400``
(``parse_float``; it would read as Infinity) and, checked after decoding, strings holding a
lone surrogate escape (not text). Sizes are bounded before reading, by whoever reads the
file (``_filesystem.safe_open.read_bounded``).
"""

from __future__ import annotations

import json
import math
from itertools import chain
from typing import Any, NoReturn

from ..errors import CkptpubError


def loads_strict(data: bytes, display_name: str, what: str) -> Any:
    """Decode UTF-8 JSON ``data``; errors name ``display_name`` and ``what`` it was meant to be.

    >>> loads_strict(b'{"a": 1, "a": 2}', "config.json", "config")
    Traceback (most recent call last):
    ckptpub.errors.CkptpubError: config.json: config is not valid JSON: duplicate key 'a'
    """
    try:
        text = data.decode("utf-8")
        value = json.loads(
            text,
            object_pairs_hook=_reject_duplicate_keys,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
        )
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


def loads_two_level(data: bytes) -> dict[str, Any] | None:
    """Decode an object of objects (a safetensors header) quickly when its keys are provably unique.

    ``object_pairs_hook`` costs a Python call per object: most of the time of a
    100k-tensor checkpoint's headers. Without a backslash in ``data`` every string
    is spelled as it reads and every colon outside a string separates a key from
    its value, so ``data`` has exactly as many colons as the decoded document has
    keys plus colons inside its strings only if no key occurred twice. Returns None
    (decode with ``loads_strict``, which names the problem) whenever that cannot be shown.
    """
    if b"\\" in data:
        return None
    try:  # UTF-8 only, as loads_strict reads it (json.loads of bytes would take UTF-16 and a BOM too)
        text = data.decode("utf-8")
        document = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if type(document) is not dict or not all(type(v) is dict for v in document.values()):
        return None
    objects = list(document.values())
    keys = len(document) + sum(map(len, objects))
    inner_keys = chain.from_iterable(objects)  # iterating an object gives its keys
    inner_strings = [s for s in chain.from_iterable(map(dict.values, objects)) if type(s) is str]
    colons_in_strings = "".join(chain(document, inner_keys, inner_strings)).count(":")
    return document if text.count(":") == keys + colons_in_strings else None


def _has_lone_surrogate(value: Any) -> bool:
    """Whether any string (key or value) of a decoded document is not text; iterative, so any depth."""
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


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r}")
            seen.add(key)
    return result


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not allowed")


def _finite_float(text: str) -> float:
    """A JSON number as a double, refusing one too large for it (``1e400`` would be Infinity)."""
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text} is out of range")
    return value
