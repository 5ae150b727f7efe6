"""JSON and base64 recognition for payload bodies."""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass
from typing import Any

_JSON_STARTS = frozenset(b'{["')
_JSON_SCALAR_STARTS = frozenset(b"-0123456789tfn")
_WHITESPACE = b" \t\r\n"
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_BASE64_URLSAFE = re.compile(r"[A-Za-z0-9_-]+={0,2}")
# Base64 may be wrapped in lines (MIME); spaces inside mean text, not base64.
_LINE_BREAKS = re.compile(r"[\r\n]+")
#: Shortest text taken for base64 on sight (shorter words are too often valid base64 by chance).
MIN_BASE64 = 8


@dataclass(frozen=True)
class JSONResult:
    """A parsed JSON value, or why the bytes are not JSON (``error``)."""

    value: Any = None
    error: str | None = None


def looks_like_json(data: bytes, *, declared: bool) -> bool:
    """Whether ``data`` is worth handing to the JSON parser: objects, arrays and strings on sight,
    bare numbers and literals only when ``declared`` (``42`` or ``true`` alone are likelier text)."""
    head = data.lstrip(_WHITESPACE)[:1]
    if not head:
        return False
    return head[0] in _JSON_STARTS or (declared and head[0] in _JSON_SCALAR_STARTS)


def parse_json(data: bytes) -> JSONResult:
    """Parse ``data`` as JSON (UTF-8, with or without BOM); never raises. ``NaN``, ``Infinity``
    and numbers too large for a float are kept as their text, so the value stays JSON-safe."""
    try:
        text = data.decode("utf-8-sig")
        return JSONResult(json.loads(text, parse_constant=str, parse_float=_float))
    except UnicodeDecodeError as exc:
        return JSONResult(error=f"not UTF-8 at byte {exc.start}")
    except RecursionError:
        return JSONResult(error="nested too deeply to parse")
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        return JSONResult(error=str(exc)[:200])


def _float(text: str) -> float | str:
    value = float(text)
    return value if math.isfinite(value) else text


@dataclass(frozen=True)
class Base64Text:
    """Bytes decoded from base64 text; ``alphabet`` is ``standard`` or ``urlsafe``."""

    data: bytes
    alphabet: str
    strong: bool


def unbase64(text: str, *, partial: bool = False) -> Base64Text | None:
    """Decode ``text`` as base64 (standard or URL-safe, padded or not, line breaks allowed), or
    None when it is not. ``strong``: unlikely to be base64 by chance (long enough, and padded, or
    mixing cases with digits or symbols, or long and mixing cases). ``partial``: ``text`` starts
    a longer body, so a last incomplete group is dropped.
    """
    compact = _LINE_BREAKS.sub("", text.strip())
    if partial:
        compact = compact[: len(compact) - len(compact) % 4]
    if len(compact) < 4 or len(compact.rstrip("=")) % 4 == 1:
        return None
    if _BASE64.fullmatch(compact):
        alphabet = "standard"
    elif _BASE64_URLSAFE.fullmatch(compact):
        alphabet = "urlsafe"
    else:
        return None
    padded = compact.rstrip("=")
    padded += "=" * (-len(padded) % 4)
    try:
        data = base64.b64decode(padded, altchars=b"-_" if alphabet == "urlsafe" else None)
    except (binascii.Error, ValueError):
        return None
    return Base64Text(data, alphabet, _strong(compact))


def _strong(compact: str) -> bool:
    if len(compact) < MIN_BASE64:
        return False
    head = compact[:256]
    upper = any(c.isupper() for c in head)
    lower = any(c.islower() for c in head)
    other = any(c.isdigit() or c in "+/-_" for c in head)
    mixed = upper and lower
    return compact.endswith("=") or (mixed and other) or (mixed and len(compact) >= 2 * MIN_BASE64)
