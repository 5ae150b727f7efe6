"""A message celery_dlx is about to publish (every republish is built as an :class:`Outgoing`):
raw body, headers, properties and destination."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_dlx.message.fieldtable import (
    BASIC_PROPERTIES,
    user_origin,
    write_properties,
    write_table,
)
from celery_dlx.message.headers import clean_headers
from celery_dlx.message.names import WIRE_HEADERS_PROPERTY

#: Header carrying a per-publisher sequence number, so a returned message is matched to its publish.
PUBLISH_SEQ_HEADER = "x-dlx-pubseq"

#: AMQP basic properties celery_dlx carries over when it copies a message: all but the header
#: table (written from ``headers``), ``expiration`` and ``cluster_id``.
AMQP_PROPERTIES = tuple(
    name
    for name, _, _ in BASIC_PROPERTIES
    if name not in ("application_headers", "expiration", "cluster_id")
)
#: What a copy carries over of a received message's properties: those, and the raw header table
#: (through Redis too), so user headers keep their field types.
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
    #: A property list to send as received (undecodable properties); then ``headers`` and
    #: ``properties`` are not written.
    raw_properties: bytes | None = None

    def encode(self, seq: int) -> Encoded:
        """The message as it goes on the wire, ``seq`` in :data:`PUBLISH_SEQ_HEADER`, broker
        ``x-death*`` headers left out; with the original's raw table (:data:`WIRE_HEADERS_PROPERTY`),
        unchanged headers go out as their producer encoded them. With :attr:`raw_properties`,
        those bytes are sent, with no sequence header.

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
    """An :class:`Outgoing` encoded: body, property list bytes, and the properties as values."""

    body: bytes
    properties_bytes: bytes
    properties: dict[str, Any]


def copy_properties(properties: Mapping[str, object] | None) -> dict[str, object]:
    """The properties of a received message worth carrying over to a copy."""
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
