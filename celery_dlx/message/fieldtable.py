"""AMQP 0-9-1 field tables and basic properties, read and written by celery_dlx's own code.

* **Reading that cannot be killed.** :func:`read_table` and :func:`read_properties` decode every
  field type RabbitMQ passes on, to py-amqp 5's values where py-amqp decodes them, and what it
  raises on too: a timestamp outside datetime's range is its signed epoch seconds, a 1969
  timestamp written unsigned (amqp091-go) the datetime it meant, a non-UTF-8 short string gets
  replacement characters. Malformed input (unknown tag, length past the end, nesting deeper than
  :data:`MAX_DEPTH`) raises :class:`FieldTableError`, never another exception; :func:`read_properties`
  turns it into the ``UNDECODABLE_PROPERTY`` marker with the raw bytes, for quarantine.
* **Writing that keeps the producer's types.** Given the original delivery's raw table,
  :func:`write_table` writes back byte for byte every entry the copy leaves unchanged (an int8, a
  float32, a 1969 timestamp stays as written); only what celery_dlx sets or changes is encoded
  anew, with field types every client reads (:data:`WRITTEN_TYPES`).
"""

from __future__ import annotations

import calendar
import math
from collections.abc import Mapping
from datetime import datetime, timezone
from decimal import Decimal
from struct import Struct, pack, unpack_from
from struct import error as StructError
from typing import Any, TypeVar

from celery_dlx.errors import DLXError
from celery_dlx.message.names import (
    BROKER_HEADER_PREFIXES,
    BROKER_HEADERS,
    RAW_PROPERTIES_PROPERTY,
    UNDECODABLE_PROPERTY,
    WIRE_HEADERS_PROPERTY,
)

#: Deepest nesting of tables and arrays read; deeper is malformed (py-amqp recursed until
#: Python's recursion limit, which stops the consumer).
MAX_DEPTH = 64
#: Field types celery_dlx writes for values it sets; RabbitMQ's Go, Node and Ruby clients read
#: each (``tests/interop``). What none holds exactly (ints outside 32 bits...) is written as text.
WRITTEN_TYPES = frozenset("SItdFAVTDx")
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
_UINT64 = 2**64
_DECIMAL_SCALE_MAX = 255

#: AMQP basic properties in wire order: (name, flag bit, kind); ``s`` short string, ``o``
#: octet, ``F`` the header table, ``Q`` the 64-bit timestamp.
BASIC_PROPERTIES = (
    ("content_type", 0x8000, "s"),
    ("content_encoding", 0x4000, "s"),
    ("application_headers", 0x2000, "F"),
    ("delivery_mode", 0x1000, "o"),
    ("priority", 0x0800, "o"),
    ("correlation_id", 0x0400, "s"),
    ("reply_to", 0x0200, "s"),
    ("expiration", 0x0100, "s"),
    ("message_id", 0x0080, "s"),
    ("timestamp", 0x0040, "Q"),
    ("type", 0x0020, "s"),
    ("user_id", 0x0010, "s"),
    ("app_id", 0x0008, "s"),
    ("cluster_id", 0x0004, "s"),
)


class FieldTableError(DLXError, ValueError):
    """A field table or property list that is not well-formed AMQP; the message says where."""


# -- reading -------------------------------------------------------------------------------------

Buffer = bytes | bytearray | memoryview
#: A table's key type: text, or bytes for a key that is not UTF-8 (:func:`read_table`).
_Key = TypeVar("_Key")


def _past(stop: int, end: int) -> FieldTableError:
    return FieldTableError(f"field ends past its table ({stop} > {end} bytes)")


def _need(buf: Buffer, offset: int, size: int, end: int) -> None:
    if size < 0 or offset + size > end:
        raise _past(offset + size, end)


def _text(raw: Buffer) -> str | bytes:
    """A long string or a table key as py-amqp gives it: text, or bytes when not UTF-8."""
    data = bytes(raw)
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return data


def timestamp_value(seconds: int) -> datetime | int:
    """The value of a ``T`` field: a naive UTC datetime (as py-amqp gives it), or the signed
    epoch seconds when no datetime holds it. Above 2**63: a negative time written unsigned
    (amqp091-go writes 1969 so)."""
    if seconds >= 2**63:
        seconds -= _UINT64
    try:
        return datetime.fromtimestamp(seconds, tz=timezone.utc).replace(tzinfo=None)
    except (OverflowError, OSError, ValueError):
        return seconds


#: The struct format of each number field. ``s`` is RabbitMQ's signed 16-bit int (the errata),
#: ``L`` a signed 64-bit int as py-amqp reads it.
_NUMBERS = {t: Struct(">" + f) for t, f in zip("bBsUuIilLfd", "bBhhHiIqqfd", strict=True)}


def _sized(buf: Buffer, offset: int, end: int) -> tuple[int, int]:
    """``(start, stop)`` of the content of a field whose 32-bit length is at ``offset``."""
    _need(buf, offset, 4, end)
    (size,) = unpack_from(">I", buf, offset)
    _need(buf, offset + 4, size, end)
    return offset + 4, offset + 4 + size


def _read_value(buf: Buffer, offset: int, end: int, depth: int) -> tuple[Any, int]:
    _need(buf, offset, 1, end)
    tag = chr(buf[offset])
    offset += 1
    number = _NUMBERS.get(tag)
    if number is not None:
        _need(buf, offset, number.size, end)
        return number.unpack_from(buf, offset)[0], offset + number.size
    if tag in "SxFA":
        start, stop = _sized(buf, offset, end)
        if tag == "S":
            return _text(buf[start:stop]), stop
        if tag == "x":
            return bytes(buf[start:stop]), stop
        if tag == "F":
            return _entries_value(buf, start, stop, depth + 1), stop
        if depth + 1 > MAX_DEPTH:
            raise FieldTableError(f"tables and arrays nested deeper than {MAX_DEPTH}")
        items = []
        while start < stop:
            value, start = _read_value(buf, start, stop, depth + 1)
            items.append(value)
        return items, stop
    if tag == "D":
        _need(buf, offset, 5, end)
        scale, unscaled = unpack_from(">Bi", buf, offset)
        return Decimal(unscaled) / Decimal(10**scale), offset + 5  # py-amqp's value, to the digit
    if tag == "T":
        _need(buf, offset, 8, end)
        return timestamp_value(unpack_from(">Q", buf, offset)[0]), offset + 8
    if tag == "t":
        _need(buf, offset, 1, end)
        return bool(buf[offset]), offset + 1
    if tag == "V":
        return None, offset
    raise FieldTableError(f"unknown field type {tag!r} at byte {offset - 1}")


#: Size of each fixed-size field after its tag; the others (``_SIZED``) carry a 32-bit length.
_FIXED_SIZES = {
    ord(t): n
    for t, n in zip("bBsUuIilLfdDtTV", (1, 1, 2, 2, 2, 4, 4, 8, 8, 4, 8, 5, 1, 8, 0), strict=True)
}
_SIZED = frozenset(map(ord, "SxFA"))


def _skip(buf: Buffer, offset: int, end: int) -> int:
    """Where the field at ``offset`` ends, without reading what it holds (no recursion)."""
    _need(buf, offset, 1, end)
    tag = buf[offset]
    offset += 1
    size = _FIXED_SIZES.get(tag)
    if size is not None:
        _need(buf, offset, size, end)
        return offset + size
    if tag not in _SIZED:
        raise FieldTableError(f"unknown field type {chr(tag)!r} at byte {offset - 1}")
    return _sized(buf, offset, end)[1]


def _entries_value(buf: Buffer, offset: int, end: int, depth: int) -> dict[Any, Any]:
    if depth > MAX_DEPTH:
        raise FieldTableError(f"tables and arrays nested deeper than {MAX_DEPTH}")
    out: dict[Any, Any] = {}
    while offset < end:
        size = buf[offset]
        offset += 1
        _need(buf, offset, size, end)
        key = _text(buf[offset : offset + size])
        out[key], offset = _read_value(buf, offset + size, end, depth)
    return out


def read_table(content: Buffer) -> dict[str | bytes, object]:
    """The header table whose content (the entries, without the length) is ``content``.

    Raises:
        FieldTableError: the bytes are not a well-formed table (the message says why).
    """
    try:
        return _entries_value(content, 0, len(content), 0)
    except FieldTableError:
        raise
    except (StructError, IndexError, RecursionError, MemoryError) as exc:  # never expected
        raise FieldTableError(f"malformed table: {type(exc).__name__}: {exc}") from None


def table_entries(content: Buffer) -> list[tuple[bytes, bytes]]:
    """``(name, encoded value)`` of each entry of a table's content, in wire order (values
    delimited, not read: one nested deeper than :data:`MAX_DEPTH` too).

    Raises:
        FieldTableError: the top level is not well-formed (an unknown tag, a length past the end).
    """
    return _entries(bytes(content))


def read_value(encoded: Buffer) -> object:
    """The value of one encoded field (type tag first).

    Raises:
        FieldTableError: the bytes are not one well-formed field.
    """
    value, end = _read_value(encoded, 0, len(encoded), 1)
    if end != len(encoded):
        raise FieldTableError(f"{len(encoded) - end} bytes after the field")
    return value


def header_table_span(buf: Buffer, offset: int) -> tuple[int, int] | None:
    """``(start, end)`` of the header table's content in the property list at ``offset``, or
    None when it has no table or ends first."""
    try:
        (flags,) = unpack_from(">H", buf, offset)
        offset += 2
        if not flags & 0x2000:
            return None
        for bit in (0x8000, 0x4000):
            if flags & bit:
                offset += 1 + buf[offset]
        (size,) = unpack_from(">I", buf, offset)
    except (StructError, IndexError):
        return None
    start = offset + 4
    return (start, start + size) if start + size <= len(buf) else None


def read_properties(buf: Buffer, offset: int = 0) -> dict[str, object]:
    """The basic properties of the property list at ``offset``; total.

    What py-amqp would give, plus :data:`WIRE_HEADERS_PROPERTY` (the header table's raw content);
    short strings that are not UTF-8 get replacement characters. A malformed table or list gives
    the properties read up to there, without ``application_headers``, with
    :data:`UNDECODABLE_PROPERTY` (the reason) and :data:`RAW_PROPERTIES_PROPERTY` (the raw list).
    """
    props: dict[str, Any] = {}
    end = len(buf)
    start = offset
    try:
        _need(buf, offset, 2, end)
        (flags,) = unpack_from(">H", buf, offset)
        offset += 2
        if flags & 1:
            raise FieldTableError("more than one word of property flags (not a basic class)")
        for name, bit, kind in BASIC_PROPERTIES:
            if not flags & bit:
                continue
            if kind == "s":
                _need(buf, offset, 1, end)
                size = buf[offset]
                offset += 1
                _need(buf, offset, size, end)
                props[name] = bytes(buf[offset : offset + size]).decode("utf-8", "replace")
                offset += size
            elif kind == "o":
                _need(buf, offset, 1, end)
                props[name] = buf[offset]
                offset += 1
            elif kind == "Q":
                _need(buf, offset, 8, end)
                props[name] = unpack_from(">Q", buf, offset)[0]
                offset += 8
            else:
                start_table, offset = _sized(buf, offset, end)
                content = bytes(buf[start_table:offset])
                try:
                    props[name] = read_table(content)
                except FieldTableError as exc:
                    _undecodable(props, f"header table: {exc}", buf, start)
                    continue  # the other properties (message_id...) are still read
                props[WIRE_HEADERS_PROPERTY] = content
    except FieldTableError as exc:
        _undecodable(props, f"property list: {exc}", buf, start)
    return props


def _undecodable(props: dict[str, Any], reason: str, buf: Buffer, start: int) -> None:
    props.setdefault(UNDECODABLE_PROPERTY, reason)
    props[RAW_PROPERTIES_PROPERTY] = bytes(buf[start:])


# -- writing -------------------------------------------------------------------------------------


def _short(raw: bytes) -> bytes:
    if len(raw) > 255:
        raise FieldTableError(f"a short string holds at most 255 bytes, got {len(raw)}")
    return bytes((len(raw),)) + raw


def _key(key: Any) -> bytes:
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    return str(key).encode("utf-8", "surrogatepass")


def _decimal_field(value: Decimal) -> bytes | None:
    """A decimal as ``D`` when the field holds it exactly (scale in a byte, int32 digits)."""
    if not value.is_finite():
        return None
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # finite
    unscaled = int("".join(map(str, digits)) or "0")
    if exponent > 0 or -exponent > _DECIMAL_SCALE_MAX or unscaled > INT32_MAX:
        return None
    return b"D" + pack(">Bi", -exponent, -unscaled if sign else unscaled)


def encode_value(value: object, depth: int = 0) -> bytes:
    """``value`` as one field, with a type of :data:`WRITTEN_TYPES`: bytes as a byte array,
    datetimes from 1970 on as timestamps, decimals as ``D`` when it holds them exactly; what no
    such type holds (ints outside 32 bits such as epoch ms, non-finite floats...) as its text.

    Raises:
        FieldTableError: a table key over 255 bytes.
    """
    if value is None:
        return b"V"
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        return b"S" + pack(">I", len(raw)) + raw
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        return b"x" + pack(">I", len(raw)) + raw
    if isinstance(value, int):
        if INT32_MIN <= value <= INT32_MAX:
            return b"I" + pack(">i", value)
        return encode_value(str(value))
    if isinstance(value, float):
        return b"d" + pack(">d", value) if math.isfinite(value) else encode_value(str(value))
    if isinstance(value, Decimal):
        return _decimal_field(value) or encode_value(str(value))
    if isinstance(value, datetime):
        seconds = calendar.timegm(value.utctimetuple())
        return b"T" + pack(">Q", seconds) if seconds >= 0 else encode_value(value.isoformat())
    if depth >= MAX_DEPTH and isinstance(value, (Mapping, list, tuple)):
        # Only reached without the original bytes (a record from before they were kept).
        return encode_value(f"<{type(value).__name__} nested deeper than {MAX_DEPTH} levels>")
    if isinstance(value, Mapping):
        content = b"".join(_short(_key(k)) + encode_value(v, depth + 1) for k, v in value.items())
        return b"F" + pack(">I", len(content)) + content
    if isinstance(value, (list, tuple)):
        content = b"".join(encode_value(v, depth + 1) for v in value)
        return b"A" + pack(">I", len(content)) + content
    return encode_value(str(value))


def same_value(a: object, b: object) -> bool:
    """Whether two header values are the same value of the same kind (``True`` is not ``1``,
    ``-0.0`` not ``0.0``); bytes-likes compare as bytes, tuples as lists."""
    if isinstance(a, (bytes, bytearray, memoryview)):
        return isinstance(b, (bytes, bytearray, memoryview)) and bytes(a) == bytes(b)
    if isinstance(a, Mapping):
        return (
            isinstance(b, Mapping)
            and len(a) == len(b)
            and all(k in b and same_value(v, b[k]) for k, v in a.items())
        )
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same_value, a, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and isinstance(b, float):  # b is: the types are the same
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return bool(a == b)


def write_table(headers: Mapping[_Key, object], origin: Buffer | None = None) -> bytes:
    """The content of a header table holding ``headers`` (entries only, no length).

    ``origin``: the raw content of the original delivery's table (ignored when malformed). An
    entry whose value is the same as there (:func:`same_value`) is written back as its producer
    encoded it; every other with :func:`encode_value`.

    Raises:
        FieldTableError: a key over 255 bytes.
    """
    kept: dict[str | bytes, tuple[bytes, bytes]] = {}
    if origin:
        try:
            for raw_key, encoded in table_entries(origin):
                kept[_text(raw_key)] = (raw_key, encoded)
        except FieldTableError:
            kept = {}
    out = bytearray()
    for key, value in headers.items():
        found = kept.get(key) if isinstance(key, (str, bytes)) else None
        if found is not None and _unchanged(value, found[1]):
            out += _short(found[0]) + found[1]
        else:
            out += _short(_key(key)) + encode_value(value, 1)
    return bytes(out)


def user_origin(content: Buffer | None) -> bytes | None:
    """What a copy needs to keep of a delivery's raw header table: its user entries, or None when
    :func:`encode_value` writes them back to the same bytes anyway (every Celery or py-amqp
    table: stored records then carry no second copy). A malformed table is kept whole."""
    if not content:
        return None
    try:
        user = _entries(bytes(content), _OWN_OR_BROKER)
        if not user or _written_back_alike(user):
            return None
        kept = b"".join(_short(k) + v for k, v in user)
        if write_table(read_table(kept)) == kept:
            return None
    except FieldTableError:
        return bytes(content)
    return kept


#: Names a copy never keeps from the raw table: celery_dlx's and the broker's (ASCII: a name
#: starts with one exactly when its text does).
_OWN_OR_BROKER = (b"x-dlx-", *(n.encode() for n in (*BROKER_HEADER_PREFIXES, *BROKER_HEADERS)))


def _entries(data: bytes, drop: tuple[bytes, ...] = ()) -> list[tuple[bytes, bytes]]:
    """:func:`table_entries`, without those whose name starts with one of ``drop``, walked inline.

    Counted gain (a speed trick stays where it saves 5% of its path): dropping
    :data:`_OWN_OR_BROKER`'s inline against filtering the entries of a walk that called a helper
    per field (commit c4ac613 against ca70444, both without :func:`_written_back_alike`): a P6 dead
    letter's own work without I/O (``benchmarks/tricks_cpu.py --part all``) takes 675,397
    instructions with it and 721,585 without: 6.4% of it. A handled failure in a solo worker
    (``benchmarks/tricks_io.py --part failure``): 2,960,454 against 3,053,697 (3.1%).
    """
    out = []
    offset, end = 0, len(data)
    while offset < end:
        start = offset + 1 + data[offset]  # past the name: the value's type tag
        if start >= end:  # the name ends past the table, or no room for the tag
            raise _past(max(start, end + 1), end)
        tag = data[start]
        size = _FIXED_SIZES.get(tag)
        if size is not None:
            stop = start + 1 + size
        elif tag in _SIZED:
            if start + 5 > end:
                raise _past(start + 5, end)
            stop = start + 5 + int.from_bytes(data[start + 1 : start + 5], "big")
        else:
            raise FieldTableError(f"unknown field type {chr(tag)!r} at byte {start}")
        if stop > end:
            raise _past(stop, end)
        name = data[offset + 1 : start]
        if not name.startswith(drop):
            out.append((name, data[start:stop]))
        offset = stop
    return out


def _written_back_alike(entries: list[tuple[bytes, bytes]]) -> bool:
    """True when reading ``entries`` and writing them with :func:`write_table` surely gives the
    same bytes, judged from the encodings alone: distinct keys, values :func:`encode_value` writes
    back as they are (Celery's ``timelimit: [None, None]``, ``stamps: {}`` included). False: not
    known, the caller compares the read-and-written bytes.

    Counted gain (a speed trick stays where it saves 5% of its path), against always reading and
    writing the user entries to compare (commit dae0f5a against ca70444): a handled failure in a
    solo worker, whose copy of a Celery task message takes it (``benchmarks/tricks_io.py --part
    failure``), 2,558,702 instructions with it and 2,960,454 without: 13.6%; a P6 dead letter's
    own work without I/O (``benchmarks/tricks_cpu.py --part all``) 625,203 against 676,065 (7.5%).
    """
    if len({k for k, _ in entries}) != len(entries):
        return False
    try:
        return all(_value_alike(encoded, 0, len(encoded), 0) for _, encoded in entries)
    except (FieldTableError, IndexError):  # not well-formed: not known
        return False


#: Field types whose every value is written back to the same bytes.
_ALIKE_AS_READ = frozenset(map(ord, "IV"))
#: Deepest nesting judged from the bytes (far below :data:`MAX_DEPTH`, past which
#: :func:`encode_value` writes text); deeper tables are compared the long way.
_ALIKE_DEPTH = 8


def _value_alike(data: bytes, start: int, stop: int, depth: int) -> bool:
    """Whether the field ``data[start:stop]`` reads to a value :func:`encode_value` writes back
    to the same bytes; raises FieldTableError or IndexError for a malformed array or table."""
    tag = data[start]
    if tag == 83:  # S
        try:  # read as text (written back alike); not UTF-8, it reads as bytes: an "x"
            data[start + 5 : stop].decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            return False
        return True
    if tag == 116:  # t
        return data[start + 1] <= 1  # any other non-zero octet reads True, written back as 1
    if tag in _ALIKE_AS_READ:
        return True
    if tag not in (65, 70) or depth >= _ALIKE_DEPTH:  # A array, F table
        return False
    offset = start + 5
    names: set[bytes] = set()
    while offset < stop:
        if tag == 70:  # a name first, then its value; a repeated name reads as one
            size = data[offset]
            name = data[offset + 1 : offset + 1 + size]
            if name in names:
                return False
            names.add(name)
            offset += 1 + size
        end = _skip(data, offset, stop)
        if not _value_alike(data, offset, end, depth + 1):
            return False
        offset = end
    return True


def _unchanged(value: Any, encoded: bytes) -> bool:
    try:
        return same_value(value, read_value(encoded))
    except FieldTableError:  # nested past MAX_DEPTH (py-amqp read it): celery_dlx never edits it
        return True


def write_properties(properties: Mapping[str, object], table: bytes | None) -> bytes:
    """A basic property list: flags, then each property ``properties`` sets, in wire order;
    ``table`` is the header table's content (``application_headers`` is ignored).

    Raises:
        FieldTableError: a short string over 255 bytes, or an octet or timestamp out of range.
    """
    flags = 0
    out = bytearray()
    for name, bit, kind in BASIC_PROPERTIES:
        if kind == "F":
            if table is None:
                continue
            flags |= bit
            out += pack(">I", len(table)) + table
            continue
        value: Any = properties.get(name)  # what the producer set: int() and str() judge it
        if value is None:
            continue
        flags |= bit
        if kind == "s":
            out += _short(str(value).encode("utf-8", "surrogatepass"))
        elif kind == "o":
            if not 0 <= int(value) <= 255:
                raise FieldTableError(f"property {name} must be an octet, got {value!r}")
            out.append(int(value))
        else:
            seconds = int(value.timestamp()) if isinstance(value, datetime) else int(value)
            if not 0 <= seconds < _UINT64:
                raise FieldTableError(f"property {name} out of range: {value!r}")
            out += pack(">Q", seconds)
    return pack(">H", flags) + bytes(out)
