"""Rebuilding a Celery task message inside the worker, to requeue or park an exact copy: the
delivery's headers and properties, the decoded arguments re-encoded with its own serializer, in
its own task protocol (2, or 1, which Celery still accepts); celery_dlx's headers updated and
broker headers stripped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kombu import serialization
from kombu.compression import compress

from celery_dlx.compat import serializer_name
from celery_dlx.message.copies import _body_v1, delivery_headers, task_protocol
from celery_dlx.message.headers import DLXState, clean_headers
from celery_dlx.message.outgoing import Outgoing, copy_properties

if TYPE_CHECKING:
    from celery.app.task import Context


def celery_copy(
    request: Context,
    *,
    state: DLXState,
    routing_key: str,
    exchange: str = "",
    default_serializer: str = "json",
    extra_headers: Mapping[str, object] | None = None,
    retries: int | None = None,
    args: Iterable[object] | None = None,
    kwargs: Mapping[str, object] | None = None,
) -> Outgoing:
    """A copy of the running task's message carrying ``state``, in the message's own protocol;
    ``retries`` (``request.retries`` of its next run), ``args`` and ``kwargs`` replace the
    delivery's unless None.

    Raises:
        kombu.exceptions.EncodeError: the arguments cannot be encoded again (never seen for a
            message that was decoded from the same serializer).
    """
    props = request.properties or {}
    original = delivery_headers(request)
    protocol = task_protocol(original)
    headers = clean_headers(original, state)
    if extra_headers:
        headers.update(extra_headers)
    content_type = props.get("content_type")
    serializer = (serializer_name(content_type) if content_type else None) or default_serializer
    call_args = list(request.args or ()) if args is None else list(args)
    call_kwargs = dict(request.kwargs or {}) if kwargs is None else dict(kwargs)
    payload: Any
    if protocol == 2:
        if retries is not None:
            headers["retries"] = retries
        embed = {
            "callbacks": request.callbacks,
            "errbacks": request.errbacks,
            "chain": request.chain,
            "chord": request.chord,
        }
        payload = (call_args, call_kwargs, embed)
    else:
        if retries is None:
            retries = int(getattr(request, "retries", 0) or 0)
        payload = _body_v1(request, call_args, call_kwargs, retries)
    body: bytes | str  # kombu returns bytes for binary serializers (celery-types says str)
    ctype, cenc, body = serialization.dumps(payload, serializer=serializer)
    compression = headers.get("compression")
    if compression:
        body, _ = compress(body, str(compression))
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
