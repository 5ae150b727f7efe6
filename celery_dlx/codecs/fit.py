"""How well a protobuf type fits a body, measured on the wire fields (no schema-less guessing).

A type's score (0 to 1) weighs, in this order: the share of wire fields the type declares with the
wire type found (nested messages included), the share of the type's own fields present, and its
required (proto2) fields being present. Only a type the protobuf parser accepts can win.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .jsonsafe import printable_text
from .limits import MAX_CANDIDATES, MAX_SCAN_FIELDS, MAX_TYPED_DEPTH
from .registry import ProtobufRegistry
from .wire import FIXED32, FIXED64, LEN, START_GROUP, VARINT, Field, Scan, scan

# FieldDescriptor.TYPE_* numbers (fixed by descriptor.proto) -> the wire type they travel as.
_WIRE_OF = {
    1: FIXED64,  # double
    2: FIXED32,  # float
    3: VARINT,  # int64
    4: VARINT,  # uint64
    5: VARINT,  # int32
    6: FIXED64,  # fixed64
    7: FIXED32,  # fixed32
    8: VARINT,  # bool
    9: LEN,  # string
    10: START_GROUP,  # group
    11: LEN,  # message
    12: LEN,  # bytes
    13: VARINT,  # uint32
    14: VARINT,  # enum
    15: FIXED32,  # sfixed32
    16: FIXED64,  # sfixed64
    17: VARINT,  # sint32
    18: VARINT,  # sint64
}
_TYPE_BOOL, _TYPE_STRING, _TYPE_GROUP, _TYPE_MESSAGE = 8, 9, 10, 11
# 32-bit varint types: int32 and enum (negatives travel sign-extended to 64 bits), uint32, sint32.
_SIGNED_32 = frozenset({5, 14})
_UNSIGNED_32 = frozenset({13, 17})
_INT32_NEGATIVE = (1 << 64) - (1 << 31)
_WEIGHT_MATCH, _WEIGHT_COVERAGE, _WEIGHT_REQUIRED = 0.7, 0.2, 0.1
#: Share of wire fields a type must explain to be used rather than a schema-less dump.
MIN_MATCH = 0.6


def is_repeated(fd: Any) -> bool:
    """Whether a field descriptor is repeated (works across protobuf versions)."""
    flag = getattr(fd, "is_repeated", None)
    return bool(flag) if flag is not None else bool(fd.label == fd.LABEL_REPEATED)


def is_required(fd: Any) -> bool:
    """Whether a field descriptor is a proto2 required field (works across protobuf versions)."""
    flag = getattr(fd, "is_required", None)
    return bool(flag) if flag is not None else bool(fd.label == fd.LABEL_REQUIRED)


@dataclass
class _Tally:
    matched: int = 0
    total: int = 0
    nodes: int = 0
    seen: set[int] = field(default_factory=set)
    strays: list[Field] = field(default_factory=list)
    cache: dict[int, tuple[bytes, Scan]] = field(default_factory=dict)


@dataclass(frozen=True)
class Fit:
    """One type measured against one body."""

    type_name: str
    score: float
    match: float
    coverage: float
    missing_required: tuple[str, ...]
    strays: tuple[Field, ...]
    nested: bool = False
    message: Any = None


def rank(
    registry: ProtobufRegistry, scanned: Scan, data: bytes, hint: str | None = None
) -> list[Fit]:
    """Registered types that parse ``data``, best first (``hint``, when it parses, first of all).

    Every type is measured on the wire fields; only the best :data:`MAX_CANDIDATES` (and the hint)
    are parsed by protobuf, which also confirms nested required fields.
    """
    cache: dict[int, tuple[bytes, Scan]] = {}
    cheap = [_measure(name, cls, scanned, cache) for name, cls in registry.candidates()]
    cheap.sort(key=_order)
    chosen = cheap[:MAX_CANDIDATES]
    chosen += [f for f in cheap[MAX_CANDIDATES:] if f.type_name == hint]
    parsed = [fit for fit in (_parse(f, registry, data) for f in chosen) if fit is not None]
    parsed.sort(key=lambda f: (f.type_name != hint, *_order(f)))
    return parsed


def _order(fit: Fit) -> tuple[float, bool, str]:
    # On equal scores a top-level type beats a nested one (nested types are parts of payloads).
    return (-fit.score, fit.nested, fit.type_name)


def _measure(name: str, cls: Any, scanned: Scan, cache: dict[int, tuple[bytes, Scan]]) -> Fit:
    descriptor = cls.DESCRIPTOR
    tally = _Tally(cache=cache)
    _walk(descriptor, scanned.fields, 0, tally)
    declared = len(descriptor.fields)
    missing = tuple(
        fd.name for fd in descriptor.fields if is_required(fd) and fd.number not in tally.seen
    )
    return _fit(name, tally, declared, missing, descriptor.containing_type is not None)


def _fit(name: str, tally: _Tally, declared: int, missing: tuple[str, ...], nested: bool) -> Fit:
    match = tally.matched / tally.total if tally.total else 0.0
    coverage = len(tally.seen) / declared if declared else 0.0
    score = (
        _WEIGHT_MATCH * match
        + _WEIGHT_COVERAGE * coverage
        + (_WEIGHT_REQUIRED if not missing else 0.0)
    )
    return Fit(name, round(score, 3), match, coverage, missing, tuple(tally.strays), nested)


def _parse(fit: Fit, registry: ProtobufRegistry, data: bytes) -> Fit | None:
    cls = registry.message_class(fit.type_name)
    try:
        message = cls.FromString(data)
        missing = tuple(message.FindInitializationErrors())
    except Exception:  # DecodeError, or RuntimeError/ValueError from odd inputs: does not fit
        return None
    score = fit.score
    if missing and not fit.missing_required:
        score = round(score - _WEIGHT_REQUIRED, 3)
    return replace(fit, score=score, missing_required=missing, message=message)


def _walk(
    descriptor: Any, fields: list[Field] | tuple[Field, ...], depth: int, tally: _Tally
) -> None:
    for item in fields:
        if tally.nodes >= MAX_SCAN_FIELDS:
            return
        tally.nodes += 1
        tally.total += 1
        fd = descriptor.fields_by_number.get(item.number)
        fits = fd is not None and _fits(fd, item, depth, tally)
        if fits:
            tally.matched += 1
        if depth == 0:
            if fits:
                tally.seen.add(item.number)
            else:
                tally.strays.append(item)


def _fits(fd: Any, item: Field, depth: int, tally: _Tally) -> bool:
    expected = _WIRE_OF.get(fd.type)
    value = item.value
    if item.wire_type != expected:
        return _packed_fits(fd, item, expected)
    if fd.type in (_TYPE_MESSAGE, _TYPE_GROUP):
        return _nested_fits(fd.message_type, value, depth, tally)
    if fd.type == _TYPE_STRING:
        # Parsers accept any UTF-8 (proto3) or any bytes (proto2); real strings are readable.
        return isinstance(value, bytes) and printable_text(value) is not None
    if fd.type == _TYPE_BOOL:
        return value in (0, 1)
    if fd.type in _SIGNED_32 and isinstance(value, int):
        return value < (1 << 31) or value >= _INT32_NEGATIVE
    if fd.type in _UNSIGNED_32 and isinstance(value, int):
        return value < (1 << 32)
    return True


def _nested_fits(descriptor: Any, value: Any, depth: int, tally: _Tally) -> bool:
    if depth + 1 >= MAX_TYPED_DEPTH:
        return True
    if isinstance(value, tuple):
        _walk(descriptor, value, depth + 1, tally)
        return True
    if not isinstance(value, bytes):
        return False
    key = id(value)
    if key not in tally.cache:
        tally.cache[key] = (value, scan(value))
    inner = tally.cache[key][1]
    if not inner.ok:
        return False
    _walk(descriptor, inner.fields, depth + 1, tally)
    return True


def _packed_fits(fd: Any, item: Field, expected: int | None) -> bool:
    """A repeated number field may arrive packed: one length-delimited run of values."""
    if item.wire_type != LEN or not is_repeated(fd) or expected not in (VARINT, FIXED32, FIXED64):
        return False
    value = item.value
    if not isinstance(value, bytes):
        return False
    if expected == FIXED32:
        return len(value) % 4 == 0
    if expected == FIXED64:
        return len(value) % 8 == 0
    # Varints end on a byte without the high bit, so a packed run ends on one too.
    return not value or value[-1] < 0x80
