"""Protobuf wire format read without a schema (pure Python, no protobuf package needed).

:func:`scan` splits bytes into fields; :func:`dump` shows them as JSON-safe data. Both are bounded:
``scan`` stops after a number of fields, ``dump`` after a number of fields and a nesting depth.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Union

from celery_dlx.codecs.jsonsafe import hex_preview, printable_text
from celery_dlx.codecs.limits import MAX_DUMP_FIELDS, MAX_SCAN_FIELDS, MAX_WIRE_DEPTH, PREVIEW_BYTES

VARINT, FIXED64, LEN, START_GROUP, END_GROUP, FIXED32 = 0, 1, 2, 3, 4, 5
#: Names of the wire types, as a dump shows them.
WIRE_NAMES = {
    VARINT: "varint",
    FIXED64: "fixed64",
    LEN: "length-delimited",
    START_GROUP: "group",
    FIXED32: "fixed32",
}
MAX_FIELD_NUMBER = (1 << 29) - 1
# Groups nest inside one scan; deeper than this is treated as corrupt rather than recursed into.
_MAX_GROUP_DEPTH = 32

Value = Union[int, bytes, "tuple[Field, ...]"]


@dataclass(frozen=True)
class Field:
    """One field on the wire: number, wire type, value and byte offset in its message."""

    number: int
    wire_type: int
    value: Value
    offset: int


@dataclass
class Scan:
    """Fields read from a buffer; ``error`` says why reading stopped early (None: all read)."""

    fields: list[Field] = field(default_factory=list)
    error: str | None = None
    capped: bool = False
    #: Where the data would have to go on for the field that failed to be whole, when the
    #: error is the data ending mid-field (a cut body) rather than bytes that are not protobuf.
    needs: int | None = None

    @property
    def ok(self) -> bool:
        """Every byte was read as well-formed fields."""
        return self.error is None and not self.capped


class _Corrupt(ValueError):
    pass


class _Ended(_Corrupt):
    def __init__(self, message: str, needs: int) -> None:
        super().__init__(message)
        self.needs = needs


def scan(data: bytes) -> Scan:
    """Read ``data`` as a protobuf message without a schema. Never raises."""
    result = Scan()
    pos = 0
    try:
        while pos < len(data):
            if len(result.fields) >= MAX_SCAN_FIELDS:
                result.capped = True
                break
            item, pos = _field(data, pos, 0)
            if item.wire_type == END_GROUP:
                raise _Corrupt(
                    f"end-group tag for field {item.number} at byte {item.offset} has no start"
                )
            result.fields.append(item)
    except _Corrupt as exc:
        result.error = str(exc)
        result.needs = exc.needs if isinstance(exc, _Ended) else None
    return result


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for shift in range(0, 70, 7):
        if pos >= len(data):
            raise _Ended(f"varint at byte {pos} runs past the end of the data", pos + 1)
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if value >> 64:
                raise _Corrupt(f"varint ending at byte {pos} is wider than 64 bits")
            return value, pos
    raise _Corrupt(f"varint ending at byte {pos} is longer than 10 bytes")


def _field(data: bytes, pos: int, depth: int) -> tuple[Field, int]:
    start = pos
    tag, pos = _varint(data, pos)
    number, wire_type = tag >> 3, tag & 7
    if not 1 <= number <= MAX_FIELD_NUMBER:
        raise _Corrupt(f"field number {number} at byte {start} is out of range")
    if wire_type == VARINT:
        value, pos = _varint(data, pos)
        return Field(number, wire_type, value, start), pos
    if wire_type in (FIXED64, FIXED32, LEN):
        if wire_type == LEN:
            size, pos = _varint(data, pos)
        else:
            size = 8 if wire_type == FIXED64 else 4
        if pos + size > len(data):
            raise _Ended(
                f"field {number} ({WIRE_NAMES[wire_type]}) at byte {start} "
                f"{'claims' if wire_type == LEN else 'needs'} {size} bytes "
                f"but only {len(data) - pos} remain",
                pos + size,
            )
        raw = data[pos : pos + size]
        content = raw if wire_type == LEN else int.from_bytes(raw, "little")
        return Field(number, wire_type, content, start), pos + size
    if wire_type == START_GROUP:
        return _group(data, pos, number, start, depth)
    if wire_type == END_GROUP:
        return Field(number, wire_type, 0, start), pos
    raise _Corrupt(f"field {number} at byte {start} has invalid wire type {wire_type}")


def _group(data: bytes, pos: int, number: int, start: int, depth: int) -> tuple[Field, int]:
    if depth >= _MAX_GROUP_DEPTH:
        raise _Corrupt(f"groups nested deeper than {_MAX_GROUP_DEPTH} at byte {start}")
    members: list[Field] = []
    while True:
        if pos >= len(data):
            raise _Ended(f"group {number} starting at byte {start} has no end", pos + 1)
        item, pos = _field(data, pos, depth + 1)
        if item.wire_type == END_GROUP:
            if item.number != number:
                raise _Corrupt(f"group {number} at byte {start} ends with field {item.number}")
            return Field(number, START_GROUP, tuple(members), start), pos
        members.append(item)


def dump(fields: list[Field]) -> tuple[list[dict[str, object]], bool]:
    """JSON-safe view of ``fields``; returns it and whether fields were left out (limits)."""
    budget = [MAX_DUMP_FIELDS]
    out = _dump(fields, 0, budget)
    return out, budget[0] < 0


def _dump(
    fields: list[Field] | tuple[Field, ...], depth: int, budget: list[int]
) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for done, item in enumerate(fields):
        if budget[0] <= 0:
            budget[0] = -1
            out.append({"truncated": f"{len(fields) - done} more fields not shown"})
            break
        budget[0] -= 1
        out.append(_entry(item, depth, budget))
    return out


def _entry(item: Field, depth: int, budget: list[int]) -> dict[str, object]:
    entry: dict[str, object] = {
        "field": item.number,
        "wire_type": WIRE_NAMES.get(item.wire_type, "?"),
    }
    value = item.value
    if isinstance(value, tuple):
        entry["group"] = _dump(value, depth + 1, budget)
    elif isinstance(value, bytes):
        entry["length"] = len(value)
        entry.update(_len_value(value, depth, budget))
    elif item.wire_type == VARINT:
        entry["value"] = value
        if value >> 63:
            entry["as_int64"] = value - (1 << 64)
    elif item.wire_type == FIXED64:
        entry["value"] = value
        entry["as_double"] = _float(struct.unpack("<d", value.to_bytes(8, "little"))[0])
    else:
        entry["value"] = value
        entry["as_float"] = _float(struct.unpack("<f", value.to_bytes(4, "little"))[0])
    return entry


def _len_value(value: bytes, depth: int, budget: list[int]) -> dict[str, object]:
    # Text first: short strings often also happen to parse as a message, the reverse is rare.
    text = printable_text(value)
    if text is not None:
        return {"text": text}
    if depth + 1 < MAX_WIRE_DEPTH:
        inner = scan(value)
        if inner.ok and inner.fields:
            return {"message": _dump(inner.fields, depth + 1, budget)}
    return {"hex": hex_preview(value, PREVIEW_BYTES * 4)}


def _float(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)
