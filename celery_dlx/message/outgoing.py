"""A message celery_dlx is about to publish: raw body, headers, properties and destination.

Every republish (requeue, drain, TTL ladder, replay, the DLX service, quarantine copies) is built
as an :class:`Outgoing`; :meth:`Outgoing.amqp_message` is the one place its headers are cleaned of
broker-owned ``x-death*`` headers before they reach the wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
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
        headers = clean_headers(self.headers)
        headers[PUBLISH_SEQ_HEADER] = seq
        return amqp.Message(self.body, application_headers=headers, **props)


def copy_properties(properties: Mapping[str, Any] | None) -> dict[str, Any]:
    """The properties of a received message worth carrying over to a copy."""
    return {k: v for k, v in (properties or {}).items() if k in COPIED_PROPERTIES and v is not None}
