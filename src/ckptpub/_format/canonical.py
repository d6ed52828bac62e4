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
from typing import Any

_MAX_EXACT_INT = 2**53


def canonical_json(value: Any) -> bytes:
    """Encode ``value`` (JSON types only) as canonical UTF-8 JSON bytes.

    Raises ``TypeError`` for a value that is not JSON data and ``ValueError`` for
    one that cannot be encoded (NaN, a lone surrogate). Any nesting depth the
    parser accepts is encoded: the walk keeps its own stack, not Python's.

    >>> canonical_json({"b": 1.0, "a": [True, None, "é"]})
    b'{"a":[true,null,"\\xc3\\xa9"],"b":1}'
    """
    try:
        return "".join(_encode(value)).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("holds a lone surrogate (not Unicode text)") from None


class _Text(str):
    """Output text waiting on the work stack (as opposed to a value still to encode)."""


_COMMA, _CLOSE_LIST, _CLOSE_OBJECT = _Text(","), _Text("]"), _Text("}")


def _encode(value: Any) -> list[str]:
    out: list[str] = []
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        if type(item) is _Text:
            out.append(item)
        elif item is None:
            out.append("null")
        elif item is True:
            out.append("true")
        elif item is False:
            out.append("false")
        elif isinstance(item, int):
            out.append(_format_int(item))
        elif isinstance(item, float):
            out.append(_format_float(item))
        elif isinstance(item, str):
            out.append(_quote(item))
        elif isinstance(item, (list, tuple)):
            out.append("[")
            pending.append(_CLOSE_LIST)
            for index in range(len(item) - 1, -1, -1):
                pending.append(item[index])
                if index:
                    pending.append(_COMMA)
        elif isinstance(item, dict):
            keys = sorted(item)  # TypeError for keys that cannot be ordered (mixed types)
            for key in keys:
                if not isinstance(key, str):
                    raise TypeError(f"canonical JSON object keys must be strings, not {key!r}")
            out.append("{")
            pending.append(_CLOSE_OBJECT)
            for index in range(len(keys) - 1, -1, -1):
                pending.append(item[keys[index]])
                pending.append(_Text(_quote(keys[index]) + ":"))
                if index:
                    pending.append(_COMMA)
        else:
            raise TypeError(f"not a JSON value: {type(item).__name__}")
    return out


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
