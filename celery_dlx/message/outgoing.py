"""A message celery_dlx is about to publish: raw body, headers, properties and destination.

Every republish (requeue, drain, TTL ladder, replay, the DLX service, quarantine copies) is built
as an :class:`Outgoing`; :meth:`Outgoing.encode` is the one place its headers are cleaned of
broker-owned ``x-death*`` headers and encoded, by celery_dlx's own writer
(:mod:`celery_dlx.message.fieldtable`): user headers as their producer wrote them, celery_dlx's in
field types every client decodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_dlx.message.fieldtable import user_origin, write_properties, write_table
from celery_dlx.message.headers import clean_headers
from celery_dlx.message.names import WIRE_HEADERS_PROPERTY

#: Header carrying a per-publisher sequence number, so a returned message is matched to its publish.
PUBLISH_SEQ_HEADER = "x-dlx-pubseq"

#: AMQP basic properties celery_dlx carries over when it copies a message.
AMQP_PROPERTIES = (
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
#: What a copy carries over of a received message's properties: those, and the raw header table
#: celery_dlx's frame reader kept (through Redis too), so user headers keep their field types.
COPIED_PROPERTIES = (*AMQP_PROPERTIES, WIRE_HEADERS_PROPERTY)

#: The publish sequence wraps inside 32 bits, so it always goes out as an ``I`` field.
INT32_MAX = 2**31 - 1


@dataclass
class Outgoing:
    """One message to publish: raw body, headers and AMQP properties, and where it goes."""

    body: bytes
    routing_key: str
    exchange: str = ""
    headers: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    #: A property list to send exactly as received (a message moved whose properties
    #: celery_dlx could not decode); ``headers`` and ``properties`` are then not written.
    raw_properties: bytes | None = None

    def encode(self, seq: int) -> Encoded:
        """The message as it goes on the wire, ``seq`` in :data:`PUBLISH_SEQ_HEADER`.

        Broker ``x-death*`` headers are left out. When the properties carry the original
        delivery's raw header table (:data:`WIRE_HEADERS_PROPERTY`), every header the copy
        leaves unchanged goes out as its producer encoded it; the rest with celery_dlx's
        :func:`~celery_dlx.message.fieldtable.encode_value`. With :attr:`raw_properties`, those
        bytes are sent and no sequence header (the publisher cannot match a return to it).

        Raises:
            FieldTableError: a property or header name longer than a short string.
        """
        if self.raw_properties is not None:
            return Encoded(self.body, self.raw_properties, {})
        props = {k: v for k, v in self.properties.items() if k in AMQP_PROPERTIES and v is not None}
        props.setdefault("delivery_mode", 2)
        headers = clean_headers(self.headers)
        headers[PUBLISH_SEQ_HEADER] = seq
        table = write_table(headers, self.properties.get(WIRE_HEADERS_PROPERTY))
        props["application_headers"] = headers
        return Encoded(self.body, write_properties(props, table), props)


@dataclass(frozen=True)
class Encoded:
    """An :class:`Outgoing` encoded: its body, its property list as bytes (celery_dlx's writer),
    and the properties as values (headers included) for readers."""

    body: bytes
    properties_bytes: bytes
    properties: dict[str, Any]


def copy_properties(properties: Mapping[str, object] | None) -> dict[str, object]:
    """The properties of a received message worth carrying over to a copy (the raw header table
    only where it is needed: :func:`~celery_dlx.message.fieldtable.user_origin`)."""
    return record_properties(
        {k: v for k, v in (properties or {}).items() if k in COPIED_PROPERTIES and v is not None}
    )


def record_properties(properties: Mapping[str, object]) -> dict[str, object]:
    """``properties`` with the raw header table cut to what a copy needs, or left out."""
    out = dict(properties)
    raw = out.pop(WIRE_HEADERS_PROPERTY, None)
    kept = user_origin(raw) if isinstance(raw, (bytes, bytearray, memoryview)) else None
    if kept is not None:
        out[WIRE_HEADERS_PROPERTY] = kept
    return out
