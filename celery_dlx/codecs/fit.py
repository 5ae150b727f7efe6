"""How well a protobuf type fits a body, measured on its wire fields.

A type's score (0 to 1) weighs, in this order: the share of wire fields the type explains with the
declared wire type (nested messages included, checked field by field), the share of the type's own
fields present, and its required (proto2) fields being present. A field the type calls ``bytes``
explains a value that reads as text or as a message only weakly: a type that names what is inside
explains it better. Only a type the protobuf parser accepts can win.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from celery_dlx.codecs.jsonsafe import printable_text
from celery_dlx.codecs.limits import MAX_CANDIDATES, MAX_FIT_NODES, MAX_TYPED_DEPTH, PRESELECTED
from celery_dlx.codecs.registry import ProtobufRegistry
from celery_dlx.codecs.shapes import (
    SIGNED_32,
    TYPE_BOOL,
    TYPE_BYTES,
    TYPE_STRING,
    UNSIGNED_32,
    FieldShape,
    Shape,
    shape_of,
)
from celery_dlx.codecs.wire import FIXED32, FIXED64, LEN, VARINT, Field, Scan, scan

_WEIGHT_MATCH, _WEIGHT_COVERAGE, _WEIGHT_REQUIRED = 0.7, 0.2, 0.1
# Evidence from a bytes field whose value would read as text or as a message.
_WEAK = 0.5
_INT32_NEGATIVE = (1 << 64) - (1 << 31)
#: Share of wire fields a type must explain to be used rather than a schema-less dump.
MIN_MATCH = 0.6


@dataclass(frozen=True)
class Fit:
    """One type measured against one body (``message`` is set once protobuf parsed it)."""

    type_name: str
    score: float
    match: float
    missing_required: tuple[str, ...]
    strays: tuple[Field, ...] = ()
    nested: bool = False
    message: Any = None


@dataclass
class _Tally:
    shapes: dict[str, Shape]
    scans: dict[int, tuple[bytes, Scan]]
    nodes: int = 0
    seen: set[int] = field(default_factory=set)
    strays: list[Field] = field(default_factory=list)


def rank(
    registry: ProtobufRegistry, scanned: Scan, data: bytes, hint: str | None = None
) -> tuple[list[Fit], bool]:
    """Registered types that parse ``data``, best first (``hint``, when it parses, first of all),
    and whether the search stopped at :data:`PRESELECTED` shapes with types left that might fit
    better. Types are measured field by field in the order of a quick score from top-level wire
    types (which measuring can only lower) until none left can beat the runner-up; types of one
    shape are measured once. The best :data:`MAX_CANDIDATES` are parsed by protobuf, which also
    finds missing required fields in nested messages."""
    shapes = registry.shapes
    pairs = Counter((f.number, f.wire_type) for f in scanned.fields)
    candidates = [shape_of(cls.DESCRIPTOR, shapes) for _, cls in registry.candidates()]
    quick = sorted(((_quick(shape, pairs), shape) for shape in candidates), key=lambda i: i[0])
    scans: dict[int, tuple[bytes, Scan]] = {}
    measured: list[Fit] = []
    alike: dict[tuple[Any, ...], Fit] = {}
    cut_short = False
    for (bound, *_), shape in quick:
        # Only the best and the runner-up need exact scores; the rest are parse fallbacks.
        if len(measured) >= 2 and -bound < measured[1].score:
            break
        twin = alike.get(shape.signature)
        if twin is not None:
            measured.append(replace(twin, type_name=shape.name, nested=shape.nested))
        elif len(alike) >= PRESELECTED:
            cut_short = True
            break
        else:
            alike[shape.signature] = _measure(shape, scanned, shapes, scans)
            measured.append(alike[shape.signature])
        measured.sort(key=_order)
    if hint is not None and hint in registry and all(f.type_name != hint for f in measured):
        measured.append(_measure(shapes[hint], scanned, shapes, scans))
    chosen = [f for i, f in enumerate(measured) if i < MAX_CANDIDATES or f.type_name == hint]
    parsed = [fit for fit in (_parse(f, registry, data) for f in chosen) if fit is not None]
    parsed.sort(key=lambda f: (f.type_name != hint, *_order(f)))
    return parsed, cut_short


def _order(fit: Fit) -> tuple[float, bool, str]:
    # On equal scores a top-level type beats a nested one (nested types are parts of payloads).
    return (-fit.score, fit.nested, fit.type_name)


def _quick(shape: Shape, pairs: Counter[tuple[int, int]]) -> tuple[float, bool, str]:
    """A sort key from top-level wire types alone (nested content is not looked at)."""
    total = sum(pairs.values())
    matched = sum(
        n for (number, wire), n in pairs.items() if _wire_ok(shape.fields.get(number), wire)
    )
    seen = {number for number, wire in pairs if _wire_ok(shape.fields.get(number), wire)}
    missing = any(number not in seen for number, _ in shape.required)
    score = _score(matched / total if total else 0.0, _coverage(seen, shape), not missing)
    return (-score, shape.nested, shape.name)


def _wire_ok(fs: FieldShape | None, wire: int) -> bool:
    if fs is None:
        return False
    return wire == fs.wire or (
        wire == LEN and fs.repeated and fs.wire in (VARINT, FIXED32, FIXED64)
    )


def _coverage(seen: set[int], shape: Shape) -> float:
    return len(seen) / len(shape.fields) if shape.fields else 0.0


def _score(match: float, coverage: float, required_ok: bool) -> float:
    weighted = _WEIGHT_MATCH * match + _WEIGHT_COVERAGE * coverage
    return round(weighted + (_WEIGHT_REQUIRED if required_ok else 0.0), 3)


def _measure(
    shape: Shape, scanned: Scan, shapes: dict[str, Shape], scans: dict[int, tuple[bytes, Scan]]
) -> Fit:
    tally = _Tally(shapes, scans)
    match = _walk(shape, scanned.fields, 0, tally) if scanned.fields else 0.0
    missing = tuple(name for number, name in shape.required if number not in tally.seen)
    score = _score(match, _coverage(tally.seen, shape), not missing)
    return Fit(shape.name, score, match, missing, tuple(tally.strays), shape.nested)


def _parse(fit: Fit, registry: ProtobufRegistry, data: bytes) -> Fit | None:
    cls = registry.message_class(fit.type_name)
    if cls is None:  # not a registered type: does not fit
        return None
    message: Any  # FindInitializationErrors is missing from protobuf's stubs
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
    shape: Shape, fields: list[Field] | tuple[Field, ...], depth: int, tally: _Tally
) -> float:
    """Mean evidence ``shape`` gives the fields (those read before the node budget ran out)."""
    total, got = 0, 0.0
    for item in fields:
        if tally.nodes >= MAX_FIT_NODES:
            break
        tally.nodes += 1
        total += 1
        fs = shape.fields.get(item.number)
        evidence = _evidence(fs, item, depth, tally) if fs is not None else 0.0
        got += evidence
        if depth == 0:
            if evidence:
                tally.seen.add(item.number)
            else:
                tally.strays.append(item)
    # An empty sub-message fits any message type.
    return got / total if total else 1.0


def _evidence(fs: FieldShape, item: Field, depth: int, tally: _Tally) -> float:
    """How well one declared field explains one wire field, 0 to 1."""
    value = item.value
    if item.wire_type != fs.wire:
        return 1.0 if _packed_fits(fs, item) else 0.0
    if fs.message is not None:
        return _nested(fs.message, value, depth, tally)
    if isinstance(value, bytes):
        text = printable_text(value)
        if fs.type == TYPE_STRING:
            # Parsers accept any UTF-8 (proto3) or any bytes (proto2); real strings are readable.
            return 1.0 if text is not None else 0.0
        if fs.type == TYPE_BYTES and (text is not None or (value and _scan(value, tally).ok)):
            return _WEAK
        return 1.0
    return 1.0 if _in_range(fs.type, value) else 0.0


def _in_range(type_number: int, value: Any) -> bool:
    if not isinstance(value, int):
        return True
    if type_number == TYPE_BOOL:
        return value in (0, 1)
    if type_number in SIGNED_32:
        return value < (1 << 31) or value >= _INT32_NEGATIVE
    if type_number in UNSIGNED_32:
        return value < (1 << 32)
    return True


def _scan(value: bytes, tally: _Tally) -> Scan:
    key = id(value)
    if key not in tally.scans:
        tally.scans[key] = (value, scan(value))
    return tally.scans[key][1]


def _nested(descriptor: Any, value: Any, depth: int, tally: _Tally) -> float:
    """How well a sub-message (or group) fits its declared type, 0 to 1."""
    if depth + 1 >= MAX_TYPED_DEPTH:
        return 1.0
    shape = shape_of(descriptor, tally.shapes)
    if isinstance(value, tuple):
        return _walk(shape, value, depth + 1, tally)
    if not isinstance(value, bytes):
        return 0.0
    inner = _scan(value, tally)
    if not inner.ok:
        return 0.0
    return _walk(shape, inner.fields, depth + 1, tally)


def _packed_fits(fs: FieldShape, item: Field) -> bool:
    """A repeated number field may arrive packed: one length-delimited run of values."""
    value = item.value
    if not (item.wire_type == LEN and _wire_ok(fs, LEN) and isinstance(value, bytes)):
        return False
    if fs.wire == FIXED32:
        return len(value) % 4 == 0
    if fs.wire == FIXED64:
        return len(value) % 8 == 0
    # Varints end on a byte without the high bit, so a packed run ends on one too.
    return not value or value[-1] < 0x80
