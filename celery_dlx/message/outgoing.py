"""A message celery_dlx is about to publish: raw body, headers, properties and destination.

Every republish (requeue, drain, TTL ladder, replay, the DLX service, quarantine copies) is built
as an :class:`Outgoing`; :meth:`Outgoing.amqp_message` is the one place its headers are cleaned of
broker-owned ``x-death*`` headers and encoded (:func:`wire_headers`) into AMQP field types every
client decodes before they reach the wire.
"""

from __future__ import annotations

import calendar
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import amqp

from celery_dlx.message.headers import clean_headers

#: Header carrying a per-publisher sequence number, so a returned message is matched to its publish.
PUBLISH_SEQ_HEADER = "x-dlx-pubseq"

#: AMQP basic properties celery_dlx carries over when it copies a message.
COPIED_PROPERTIES = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
)

#: AMQP field-type tags (as py-amqp writes them) that RabbitMQ's own clients decode: long string,
#: signed 32-bit int, boolean, double, table, array, void, timestamp, decimal. Proven by the
#: real Go (amqp091-go), Node (amqplib) and Ruby (bunny) consumers of ``tests/interop``.
#: Missing on purpose: ``L``, py-amqp's letter for any int outside 32 bits, which amqp091-go
#: (connection error 501) and amqplib (``Unexpected type tag "L"``) cannot read.
SAFE_FIELD_TYPES = frozenset("SItdFAVTD")
#: The int range py-amqp writes as ``I`` (it writes ``L`` below -2**31 + 1, not only below -2**31).
INT32_MIN = -(2**31) + 1
INT32_MAX = 2**31 - 1
#: Limits of py-amqp's ``D`` encoding: scale in an unsigned byte, unscaled value in a signed int32.
_DECIMAL_SCALE_MAX = 255


def _wire_decimal(value: Decimal) -> Decimal | str:
    """A decimal as ``D`` when py-amqp can write it exactly, else its text."""
    if not value.is_finite():
        return str(value)
    _sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # finite
    unscaled = int("".join(map(str, digits)) or "0")
    if exponent > 0 or -exponent > _DECIMAL_SCALE_MAX or unscaled > INT32_MAX:
        return str(value)
    return value


def wire_value(value: Any) -> Any:
    """``value`` in a form py-amqp writes with a tag of :data:`SAFE_FIELD_TYPES`.

    Ints outside 32 bits (epoch milliseconds, a Go ``int64`` carried over) become their decimal
    text, exactly; so do decimals ``D`` cannot hold and values no field type holds. Strings,
    booleans, floats, in-range ints, ``None``, datetimes and decimals are kept; tables and arrays
    are encoded item by item. Bytes stay bytes (py-amqp writes them as a long string ``S``).
    """
    if value is None or isinstance(value, (str, bytes, bool)):
        return value
    if isinstance(value, datetime):
        # py-amqp writes ``T`` as unsigned epoch seconds: a time before 1970 cannot be written.
        return value if calendar.timegm(value.utctimetuple()) >= 0 else value.isoformat()
    if isinstance(value, int):
        return value if INT32_MIN <= value <= INT32_MAX else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Decimal):
        return _wire_decimal(value)
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, Mapping):
        return wire_headers(value)
    if isinstance(value, (list, tuple)):
        return [wire_value(v) for v in value]
    return str(value)


def wire_headers(headers: Mapping[Any, Any]) -> dict[Any, Any]:
    """``headers`` with every value (nested ones too) encoded by :func:`wire_value`."""
    return {k: wire_value(v) for k, v in headers.items()}


@dataclass
class Outgoing:
    """One message to publish: raw body, headers and AMQP properties, and where it goes."""

    body: bytes
    routing_key: str
    exchange: str = ""
    headers: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)

    def amqp_message(self, seq: int) -> amqp.Message:
        props = {
            k: v for k, v in self.properties.items() if k in COPIED_PROPERTIES and v is not None
        }
        props.setdefault("delivery_mode", 2)
        headers = wire_headers(clean_headers(self.headers))
        headers[PUBLISH_SEQ_HEADER] = seq
        return amqp.Message(self.body, application_headers=headers, **props)


def copy_properties(properties: Mapping[str, Any] | None) -> dict[str, Any]:
    """The properties of a received message worth carrying over to a copy."""
    return {k: v for k, v in (properties or {}).items() if k in COPIED_PROPERTIES and v is not None}
