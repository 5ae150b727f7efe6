"""Rebuilding a Celery task message inside the worker, to requeue or park an exact copy.

The worker child has the delivery's full header table and properties (``request.properties``)
and the decoded arguments; the body is re-encoded with the delivery's own serializer, so a copy
is the same message with celery_dlx's headers updated and broker headers stripped.
"""

from __future__ import annotations

from typing import Any

from kombu import serialization
from kombu.compression import compress

from celery_dlx.compat import serializer_name
from celery_dlx.message.headers import DLXState, clean_headers
from celery_dlx.message.outgoing import Outgoing, copy_properties


def delivery_headers(request: Any) -> dict[str, Any]:
    """The delivery's full AMQP header table (Celery's and custom headers)."""
    props = request.properties or {}
    raw = props.get("application_headers")
    if isinstance(raw, dict):
        return dict(raw)
    return dict(request.headers or {})


def celery_copy(
    request: Any,
    *,
    state: DLXState,
    routing_key: str,
    exchange: str = "",
    default_serializer: str = "json",
    extra_headers: dict[str, Any] | None = None,
) -> Outgoing:
    """A copy of the running task's message carrying ``state``.

    Raises:
        kombu.exceptions.EncodeError: the arguments cannot be encoded again (never seen for a
            message that was decoded from the same serializer).
    """
    props = request.properties or {}
    headers = clean_headers(delivery_headers(request), state)
    if extra_headers:
        headers.update(extra_headers)
    content_type = props.get("content_type")
    serializer = (serializer_name(content_type) if content_type else None) or default_serializer
    embed = {
        "callbacks": request.callbacks,
        "errbacks": request.errbacks,
        "chain": request.chain,
        "chord": request.chord,
    }
    body: bytes | str  # kombu returns bytes for binary serializers (celery-types says str)
    ctype, cenc, body = serialization.dumps(
        (list(request.args or ()), dict(request.kwargs or {}), embed), serializer=serializer
    )
    compression = headers.get("compression")
    if compression:
        body, _ = compress(body, compression)
    properties = copy_properties(props)
    properties["content_type"] = ctype
    properties["content_encoding"] = cenc
    priority = (request.delivery_info or {}).get("priority")
    if priority is not None:
        properties["priority"] = priority
    return Outgoing(
        body=body if isinstance(body, bytes) else body.encode(cenc or "utf-8"),
        routing_key=routing_key,
        exchange=exchange,
        headers=headers,
        properties=properties,
    )
