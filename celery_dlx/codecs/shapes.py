"""Protobuf message types reduced to what fitting needs: per field number, wire type and kind.

Reading descriptors is slow next to plain dicts: a registry keeps each type's shape once built,
so fitting a body against hundreds of types stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery_dlx.codecs.wire import FIXED32, FIXED64, LEN, START_GROUP, VARINT

if TYPE_CHECKING:  # protobuf is an extra
    from google.protobuf.descriptor import FieldDescriptor

# FieldDescriptor.TYPE_* numbers (fixed by descriptor.proto) -> the wire type they travel as.
WIRE_OF = {
    **dict.fromkeys((3, 4, 5, 8, 13, 14, 17, 18), VARINT),  # (u)int32/64, bool, enum, sint32/64
    **dict.fromkeys((1, 6, 16), FIXED64),  # double, fixed64, sfixed64
    **dict.fromkeys((2, 7, 15), FIXED32),  # float, fixed32, sfixed32
    **dict.fromkeys((9, 11, 12), LEN),  # string, message, bytes
    10: START_GROUP,  # group
}
TYPE_BOOL, TYPE_STRING, TYPE_BYTES, TYPE_ENUM = 8, 9, 12, 14
#: 32-bit varint types whose negatives travel sign-extended to 64 bits (int32, enum).
SIGNED_32 = frozenset({5, 14})
#: 32-bit varint types that never exceed 32 bits on the wire (uint32, sint32).
UNSIGNED_32 = frozenset({13, 17})


def _flag(fd: FieldDescriptor, name: str, label: str) -> bool:
    flag = getattr(fd, name, None)
    if flag is not None:
        return bool(flag)
    legacy: Any = fd  # protobuf before is_repeated/is_required: only its label says
    return bool(legacy.label == getattr(legacy, label))


def is_repeated(fd: FieldDescriptor) -> bool:
    """Whether a field descriptor is repeated (works across protobuf versions)."""
    return _flag(fd, "is_repeated", "LABEL_REPEATED")


@dataclass(frozen=True)
class FieldShape:
    """One declared field: the wire type it travels as, its type number, and its message type."""

    wire: int | None
    type: int
    repeated: bool
    message: Any = None  # its message descriptor


@dataclass(frozen=True)
class Shape:
    """One message type: its fields by number, required fields, and whether it is nested."""

    name: str
    fields: dict[int, FieldShape]
    required: tuple[tuple[int, str], ...]
    nested: bool
    #: Equal for types that look the same on the wire (so fit the same bodies equally).
    signature: tuple[Any, ...] = ()


def shape_of(descriptor: Any, cache: dict[str, Shape]) -> Shape:
    """The shape of a message descriptor (Python or upb), built once per ``cache``."""
    name = descriptor.full_name
    found = cache.get(name)
    if found is not None:
        return found
    fields = {
        fd.number: FieldShape(WIRE_OF.get(fd.type), fd.type, is_repeated(fd), fd.message_type)
        for fd in descriptor.fields
    }
    required = tuple(
        (fd.number, fd.name)
        for fd in descriptor.fields
        if _flag(fd, "is_required", "LABEL_REQUIRED")  # proto2 required
    )
    signature = tuple(
        (number, fs.wire, fs.type, fs.repeated, fs.message.full_name if fs.message else None)
        for number, fs in sorted(fields.items())
    ) + tuple(number for number, _ in required)
    shape = Shape(name, fields, required, descriptor.containing_type is not None, signature)
    cache[name] = shape
    return shape
