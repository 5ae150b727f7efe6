"""A parsed protobuf message as JSON-safe data an operator can read.

Unlike the canonical JSON mapping, 64-bit integers stay numbers, enums show their names, bytes
show as text when they are printable (else ``0x`` and hex), and only fields that are set appear.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from celery_dlx.codecs.jsonsafe import hex_preview, printable_text
from celery_dlx.codecs.limits import MAX_TYPED_DEPTH, PREVIEW_BYTES
from celery_dlx.codecs.shapes import TYPE_BYTES, TYPE_ENUM, is_repeated

if TYPE_CHECKING:  # protobuf is an extra
    from google.protobuf.message import Message

# Values of bytes fields longer than this are shown as a hex preview only.
_BYTES_SHOWN = PREVIEW_BYTES * 16
_NOT_WELL_KNOWN = object()


def message_data(message: Message, depth: int = 0) -> dict[str, object]:
    """The fields set in ``message`` (a parsed protobuf message), keyed by field name."""
    out: dict[str, object] = {}
    for fd, value in message.ListFields():
        name = f"[{fd.full_name}]" if fd.is_extension else fd.name
        out[name] = _field_value(fd, value, depth)
    return out


def _field_value(fd: Any, value: Any, depth: int) -> Any:
    entry = fd.message_type
    if entry is not None and entry.GetOptions().map_entry:
        value_fd = entry.fields_by_name["value"]
        return {str(k): _single(value_fd, value[k], depth) for k in value}
    if is_repeated(fd):
        return [_single(fd, item, depth) for item in value]
    return _single(fd, value, depth)


def _single(fd: Any, value: Any, depth: int) -> Any:
    if fd.message_type is not None:
        if depth + 1 >= MAX_TYPED_DEPTH:
            return f"…(nested deeper than {MAX_TYPED_DEPTH} levels)"
        known = _well_known(value)
        return message_data(value, depth + 1) if known is _NOT_WELL_KNOWN else known
    if fd.type == TYPE_ENUM:
        known = fd.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    if isinstance(value, bytes) and fd.type != TYPE_BYTES:
        return value.decode("utf-8", errors="replace")
    if isinstance(value, bytes):
        text = printable_text(value)
        return text if text is not None else "0x" + hex_preview(value, _BYTES_SHOWN)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _well_known(value: Any) -> Any:
    """Timestamps, durations, Struct and wrappers in canonical JSON form, if ``value`` is one."""
    if not value.DESCRIPTOR.full_name.startswith("google.protobuf."):
        return _NOT_WELL_KNOWN
    try:
        from google.protobuf import json_format

        return json_format.MessageToDict(value)
    except Exception:  # an Any naming an unknown type, a timestamp out of range...
        return _NOT_WELL_KNOWN
