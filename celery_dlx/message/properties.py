"""A basic property list read as py-amqp reads it, faster, for well-formed lists only.

celery_dlx's frame reader (:mod:`celery_dlx.broker.frames`) reads every delivery's content header
on its own connections. :func:`read_basic_properties` gives the same dict as py-amqp's
``decode_properties_basic`` in 18-27% fewer instructions (callgrind: a dead letter's table with its
``x-death``, Celery's task headers), with the header table's span, in one pass.

It is strict: what py-amqp might read differently or refuses (a field past its table, a non-UTF-8
short string, an unknown type, a timestamp no ``datetime`` holds, two words of flags) raises, and
the caller falls back to py-amqp's decoder, then to celery_dlx's total reader. Values are read as
py-amqp 5.4 reads them (``s`` a signed 16-bit int, ``l`` and ``L`` signed 64-bit ints; earlier
releases misread those, celery/kombu#2354, py-amqp#438); a property test checks the two agree.

Counted gain (a speed trick stays where it saves 5% of its path), against py-amqp's decoder and
``header_table_span`` for the raw table (commit c5bd7d0): a P6 dead letter's content header
(``benchmarks/tricks_cpu.py --part receive``, d3d96ef against c5bd7d0) 137,575 instructions
against 188,427; with 61d8a10 against 61d8a10 plus c5bd7d0's change, a whole dead letter in a DLX
service process (``benchmarks/p6_cpu.py --instructions 300,1300``, two runs each) 889,679 and
892,824 against 954,445 and 936,477: 5.7%; a no-op task in a solo worker
(``benchmarks/p2_instructions.py``) 1,036,061 against 1,095,844: 5.5% (plain Celery: 1,032,121).
"""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal
from struct import Struct
from typing import Any

from celery_dlx.errors import DLXError
from celery_dlx.message.fieldtable import BASIC_PROPERTIES

_uint32 = Struct(">I").unpack_from
_int32 = Struct(">i").unpack_from
_int64 = Struct(">q").unpack_from
_uint64 = Struct(">Q").unpack_from
_uint16 = Struct(">H").unpack_from
#: The field types few producers write. ``s`` is RabbitMQ's signed 16-bit int, ``U`` the spec's
#: short.
_RARE = {t: Struct(">" + f) for t, f in zip(b"sUuBbifd", "hhHBbIfd", strict=True)}

# Field type tags are literal octets (the letter in each comment): a constant compares faster
# than a module global, once per field of every delivery.


class PropertiesError(DLXError, ValueError):
    """A property list :func:`read_basic_properties` leaves to the long way."""


def _past(stop: int, end: int) -> PropertiesError:
    return PropertiesError(f"field ends past its container ({stop} > {end} bytes)")


def _table(buf: bytes, offset: int, limit: int) -> dict[Any, Any]:
    """The entries of a table's content ``buf[offset:limit]``."""
    out: dict[Any, Any] = {}
    while offset < limit:
        stop = offset + 1 + buf[offset]
        if stop > limit:
            raise _past(stop, limit)
        raw = buf[offset + 1 : stop]
        try:  # a name as py-amqp gives it: text, or bytes when not UTF-8
            key: Any = raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            key = raw
        out[key], offset = _value(buf, stop, limit)
    return out


def _value(buf: bytes, offset: int, end: int) -> tuple[Any, int]:
    """``(value, offset after it)`` of the field at ``offset``, which must end by ``end``."""
    if offset + 1 > end:
        raise _past(offset + 1, end)
    tag = buf[offset]
    offset += 1
    if tag in (83, 120):  # S long string, x byte array
        if offset + 4 > end:
            raise _past(offset + 4, end)
        stop = offset + 4 + _uint32(buf, offset)[0]
        if stop > end:
            raise _past(stop, end)
        raw = buf[offset + 4 : stop]
        if tag == 83:
            try:  # text, or bytes when not UTF-8 (as py-amqp gives it)
                return raw.decode("utf-8", "surrogatepass"), stop
            except UnicodeDecodeError:
                pass
        return raw, stop
    if tag == 86:  # V
        return None, offset
    if tag == 73:  # I
        if offset + 4 > end:
            raise _past(offset + 4, end)
        return _int32(buf, offset)[0], offset + 4
    if tag in (70, 65):  # F table, A array
        if offset + 4 > end:
            raise _past(offset + 4, end)
        start = offset + 4
        limit = start + _uint32(buf, offset)[0]
        if limit > end:
            raise _past(limit, end)
        if tag == 70:
            return _table(buf, start, limit), limit
        items = []
        while start < limit:
            item, start = _value(buf, start, limit)
            items.append(item)
        return items, limit
    if tag == 116:  # t
        if offset + 1 > end:
            raise _past(offset + 1, end)
        return bool(buf[offset]), offset + 1
    if tag in (108, 76):  # l, L
        if offset + 8 > end:
            raise _past(offset + 8, end)
        return _int64(buf, offset)[0], offset + 8
    if tag == 84:  # T
        if offset + 8 > end:
            raise _past(offset + 8, end)
        seconds = _uint64(buf, offset)[0]
        try:
            when = datetime.fromtimestamp(seconds, tz=timezone.utc).replace(tzinfo=None)
        except (OverflowError, OSError, ValueError) as exc:  # py-amqp raises: the long way
            raise PropertiesError(f"timestamp {seconds} out of range") from exc
        return when, offset + 8
    if tag == 68:  # D
        if offset + 5 > end:
            raise _past(offset + 5, end)
        return Decimal(_int32(buf, offset + 1)[0]) / Decimal(10 ** buf[offset]), offset + 5
    rare = _RARE.get(tag)
    if rare is None:
        raise PropertiesError(f"unknown field type {chr(tag)!r}")
    if offset + rare.size > end:
        raise _past(offset + rare.size, end)
    return rare.unpack_from(buf, offset)[0], offset + rare.size


def read_basic_properties(
    buf: bytes, offset: int
) -> tuple[dict[str, object], tuple[int, int] | None]:
    """The properties of the property list at ``buf[offset:]`` as py-amqp gives them, and the
    header table content's ``(start, end)`` (None without a table).

    Raises:
        PropertiesError, UnicodeDecodeError: a list this reader leaves to py-amqp's decoder.
    """
    end = len(buf)
    if offset + 2 > end:
        raise _past(offset + 2, end)
    flags = _uint16(buf, offset)[0]
    if flags & 1:
        raise PropertiesError("more than one word of property flags")
    offset += 2
    props: dict[str, object] = {}
    span = None
    for name, bit, kind in BASIC_PROPERTIES:
        if not flags & bit:
            continue
        if kind == "s":
            if offset + 1 > end:
                raise _past(offset + 1, end)
            stop = offset + 1 + buf[offset]
            if stop > end:
                raise _past(stop, end)
            props[name] = buf[offset + 1 : stop].decode("utf-8", "surrogatepass")
            offset = stop
        elif kind == "F":
            if offset + 4 > end:
                raise _past(offset + 4, end)
            start = offset + 4
            offset = start + _uint32(buf, start - 4)[0]
            if offset > end:
                raise _past(offset, end)
            props[name] = _table(buf, start, offset)
            span = (start, offset)
        elif kind == "o":
            if offset + 1 > end:
                raise _past(offset + 1, end)
            props[name] = buf[offset]
            offset += 1
        else:
            if offset + 8 > end:
                raise _past(offset + 8, end)
            props[name] = _uint64(buf, offset)[0]
            offset += 8
    return props, span
