"""Turning decoded values into bounded, JSON-safe data, and safe views of raw bytes."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any

from celery_dlx.codecs.limits import MAX_DATA_DEPTH, PREVIEW_BYTES

# C0 controls other than tab, newline, form feed and carriage return, and DEL: a body holding
# any of them is binary, not text.
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0e-\x1f\x7f]")
_CONTROL_TEXT = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")


class _Budget:
    """Characters of output left; ``cut`` records that something was dropped."""

    def __init__(self, remaining: int) -> None:
        self.remaining = remaining
        self.cut = False

    def take(self, size: int) -> None:
        self.remaining -= size


def prune(value: object, limit: int) -> tuple[object, bool]:
    """``value`` as JSON-safe data of roughly ``limit`` characters at most, and whether anything
    was cut (strings cut, lists and dicts lose their tail, nesting past ``MAX_DATA_DEPTH`` becomes
    a marker; non-finite floats and dict keys become strings, bytes hex)."""
    budget = _Budget(limit)
    return _prune(value, budget, 0), budget.cut


def _prune(value: Any, budget: _Budget, depth: int) -> Any:
    # Sizes taken are close to the value's JSON text, separators included.
    if value is None or isinstance(value, bool):
        budget.take(6)
        return value
    if isinstance(value, int):
        # Huge integers (JSON allows 4300 digits) are measured without formatting them.
        budget.take(min(value.bit_length() * 3 // 10 + 2, 4400) + 1)
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return _cut_text(str(value), budget)
        budget.take(len(repr(value)) + 1)
        return value
    if isinstance(value, str):
        return _cut_text(value, budget)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _cut_text(hex_preview(bytes(value), max(budget.remaining // 2, 0)), budget)
    if depth >= MAX_DATA_DEPTH:
        budget.cut = True
        return f"…(nested deeper than {MAX_DATA_DEPTH} levels)"
    if isinstance(value, Mapping):
        return _prune_mapping(value, budget, depth)
    if isinstance(value, (list, tuple)):
        return _prune_sequence(value, budget, depth)
    return _cut_text(str(value), budget)


def _cut_text(text: str, budget: _Budget) -> str:
    budget.take(3)
    if len(text) <= budget.remaining:
        budget.take(len(text))
        return text
    keep = max(budget.remaining, 0)
    budget.remaining = 0
    budget.cut = True
    return f"{text[:keep]}…(truncated: {len(text) - keep} more characters)"


def _prune_mapping(value: Mapping[Any, Any], budget: _Budget, depth: int) -> dict[str, object]:
    out: dict[str, Any] = {}
    budget.take(2)
    total = len(value)
    for done, (key, item) in enumerate(value.items()):
        if budget.remaining <= 0:
            budget.cut = True
            out["…"] = f"truncated: {total - done} more keys"
            break
        name = _cut_text(key if isinstance(key, str) else str(key), budget)
        budget.take(1)
        out[name] = _prune(item, budget, depth + 1)
    return out


def _prune_sequence(value: list[Any] | tuple[Any, ...], budget: _Budget, depth: int) -> list[Any]:
    out: list[Any] = []
    budget.take(2)
    for done, item in enumerate(value):
        if budget.remaining <= 0:
            budget.cut = True
            out.append(f"…(truncated: {len(value) - done} more items)")
            break
        out.append(_prune(item, budget, depth + 1))
    return out


def hex_preview(data: bytes, limit: int = PREVIEW_BYTES) -> str:
    """Hex of the first ``limit`` bytes of ``data``, with a marker when there are more."""
    limit = max(limit, 0)
    if len(data) <= limit:
        return data.hex()
    return f"{data[:limit].hex()}…(+{len(data) - limit} bytes)"


def opaque_view(data: bytes) -> dict[str, object]:
    """Length, sha256 and a short preview (hex, and ASCII with ``.`` for other bytes) of bytes
    nobody should or could decode."""
    return {
        "length": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "hex": hex_preview(data),
        "ascii": "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in data[:PREVIEW_BYTES]),
    }


def printable_text(data: bytes, *, partial: bool = False) -> str | None:
    """``data`` as text when it is UTF-8 without control characters, else None; ``partial``:
    ``data`` is a prefix, so a multi-byte character cut at the end is dropped, not disqualifying."""
    if _CONTROL.search(data):
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if partial and exc.start >= len(data) - 3 and exc.reason == "unexpected end of data":
            return data[: exc.start].decode("utf-8", errors="replace")
        return None


def is_printable(text: str) -> bool:
    """True when ``text`` holds no control characters (tab, newlines and form feed allowed)."""
    return _CONTROL_TEXT.search(text) is None
