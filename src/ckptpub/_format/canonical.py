"""Canonical JSON: one byte sequence for one value, so that digests of JSON are stable.

The encoding follows RFC 8785 (JCS) where it matters here: object keys sorted by
code point, no insignificant whitespace, UTF-8, strings escaped minimally, and
numbers written the way ECMAScript writes a double, so ``1.0``, ``1`` and ``1e0``
in a config file mean (and hash) the same. Integers outside the exactly
representable double range are written as exact decimals rather than rounded,
since rounding would silently merge two different configs.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any, NamedTuple

_MAX_EXACT_INT = 2**53
#: The longest encoding (in characters) ``canonical_json`` produces before it refuses: twice the
#: largest manifest a reader accepts (64 MiB), so no manifest header or config digest ckptpub
#: computes comes near it, while a value that shares its parts over and over (``[x, x]`` nested
#: 100 deep names 2**100 items) is refused after bounded work instead of running without end.
MAX_CHARS = 128 << 20


def canonical_json(value: Any, *, max_chars: int = MAX_CHARS) -> bytes:
    """Encode ``value`` (JSON types only) as canonical UTF-8 JSON bytes.

    Raises ``TypeError`` for a value that is not JSON data and ``ValueError`` for
    one that cannot be encoded: NaN, a lone surrogate, a list or dict that holds
    itself (a cycle, which would never end), or an encoding longer than
    ``max_chars`` characters (the work is bounded by it). Any nesting depth the
    parser accepts is encoded: the walk keeps its own stack, not Python's.

    >>> canonical_json({"b": 1.0, "a": [True, None, "é"]})
    b'{"a":[true,null,"\\xc3\\xa9"],"b":1}'
    """
    try:
        return "".join(_encode(value, max_chars)).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("holds a lone surrogate (not Unicode text)") from None


class _Text(str):
    """Output text waiting on the work stack (as opposed to a value still to encode)."""


class _Close(NamedTuple):
    """The end of a list or object on the work stack: its closing text, and which container it ends."""

    text: str
    container: int  # id() of the list or dict, on the walk's current path until this is reached


_COMMA = _Text(",")


def _encode(value: Any, max_chars: int) -> list[str]:
    out: list[str] = []
    length = 0
    pending: list[Any] = [value]
    open_containers: set[int] = set()  # the lists and dicts from the top down to the item at hand
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is _Text:
            text: str = item
        elif kind is _Close:
            open_containers.discard(item.container)
            text = item.text
        elif item is None:
            text = "null"
        elif item is True:
            text = "true"
        elif item is False:
            text = "false"
        elif isinstance(item, int):
            text = _format_int(item)
        elif isinstance(item, float):
            text = _format_float(item)
        elif isinstance(item, str):
            text = _quote(item)
        elif isinstance(item, (list, tuple, dict)):
            _enter(item, open_containers)
            text = _push_members(item, pending)
        else:
            raise TypeError(f"not a JSON value: {type(item).__name__}")
        out.append(text)
        length += len(text)
        if length > max_chars:
            raise ValueError(f"its canonical JSON is longer than {max_chars} characters")
    return out


def _enter(container: list[Any] | tuple[Any, ...] | dict[Any, Any], open_containers: set[int]) -> None:
    """Note that the walk is inside ``container``; one it is inside already is a cycle."""
    if id(container) in open_containers:
        raise ValueError(f"a {type(container).__name__} holds itself: a cycle, which JSON data cannot have")
    open_containers.add(id(container))


def _push_members(container: list[Any] | tuple[Any, ...] | dict[Any, Any], pending: list[Any]) -> str:
    """Push the members of a list or object (and its end) on the work stack; return its opening text."""
    if isinstance(container, dict):
        keys = sorted(container)  # TypeError for keys that cannot be ordered (mixed types)
        for key in keys:
            if not isinstance(key, str):
                raise TypeError(f"canonical JSON object keys must be strings, not {key!r}")
        pending.append(_Close("}", id(container)))
        for index in range(len(keys) - 1, -1, -1):
            pending.append(container[keys[index]])
            pending.append(_Text(_quote(keys[index]) + ":"))
            if index:
                pending.append(_COMMA)
        return "{"
    pending.append(_Close("]", id(container)))
    for index in range(len(container) - 1, -1, -1):
        pending.append(container[index])
        if index:
            pending.append(_COMMA)
    return "["


def _quote(text: str) -> str:
    """A JSON string with only the escapes JSON requires; other text stays as it is (RFC 8785 3.2.2.2).

    ``json.encoder.encode_basestring`` is what ``json.dumps(text, ensure_ascii=False)``
    calls, in C, without building an encoder per string (5 us each: most of the time
    to check a manifest's first line).
    """
    quoted: str = json.encoder.encode_basestring(text)
    return quoted


def _format_int(value: int) -> str:
    if abs(value) < _MAX_EXACT_INT:
        return str(value)
    as_float = float(value)
    if as_float == value:
        return _format_float(as_float)
    return str(value)


def _format_float(value: float) -> str:
    """ECMAScript Number::toString for a finite double (RFC 8785 section 3.2.2.3)."""
    if not math.isfinite(value):
        raise ValueError("canonical JSON has no NaN or Infinity")
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    digits, n = _shortest_digits(abs(value))  # value = 0.digits * 10**n
    k = len(digits)
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * (-n) + digits
    else:
        mantissa = digits[0] + ("." + digits[1:] if k > 1 else "")
        text = f"{mantissa}e{'+' if n - 1 >= 0 else '-'}{abs(n - 1)}"
    return sign + text


def _shortest_digits(value: float) -> tuple[str, int]:
    """The shortest digits that round-trip a positive double, and ``n`` with ``value == 0.DIGITS * 10**n``.

    ``repr`` gives the shortest round-tripping digits, as ECMAScript requires;
    ``Decimal`` splits ``'1.25e-07'`` or ``'0.02'`` into digits and exponent.
    """
    _, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    return "".join(map(str, digits)), int(exponent) + len(digits)  # int: a finite value
