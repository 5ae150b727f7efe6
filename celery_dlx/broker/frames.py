"""celery_dlx's own AMQP frame reader, for celery_dlx's own connections.

py-amqp decodes a delivery's properties inside the connection's frame reader, and raises there on
values RabbitMQ and other clients carry happily: a timestamp header outside Python's datetime
range (``OverflowError``; amqp091-go writes 1969 as the unsigned wrap-around), a short string
that is not UTF-8, tables nested past the recursion limit, an unknown field type. The delivery
never reaches the consumer; the broker redelivers it to the next one, which dies the same way.

:data:`frame_handler` goes to py-amqp as the ``Connection(frame_handler=...)`` argument (kombu
passes it on from ``transport_options``) of the connections made :func:`tolerant` only: its
content headers are read by :func:`decode_content_header`, which never raises. The raw header
table goes into the properties (``x-dlx-wire-headers``), so copies keep every header as its
producer wrote it.
"""

from __future__ import annotations

from collections.abc import Callable
from struct import unpack_from

import amqp
from celery import Celery
from kombu import Connection

from celery_dlx.broker.buffered import buffered
from celery_dlx.compat.amqp import Callback, Frame, decode_properties, frame_reader
from celery_dlx.message.fieldtable import header_table_span, read_properties
from celery_dlx.message.names import WIRE_HEADERS_PROPERTY
from celery_dlx.message.properties import read_basic_properties

#: Offset of the property list in a content header frame (class, weight, body size).
_PROPERTIES_AT = 12


def decode_content_header(buf: bytes) -> tuple[int, int, dict[str, object]]:
    """``(class id, body size, properties)`` of a content header frame's payload, read by the
    fast reader, else py-amqp's decoder, else celery_dlx's total reader (which never raises)."""
    class_id, body_size = unpack_from(">HxxQ", buf, 0)
    try:
        properties, span = read_basic_properties(buf, _PROPERTIES_AT)
    except Exception:  # not a list the fast reader takes: py-amqp's decoder reads it
        try:
            properties, _ = decode_properties(buf, _PROPERTIES_AT)
        except Exception:  # anything py-amqp cannot decode: read by celery_dlx's total reader
            return class_id, body_size, read_properties(buf, _PROPERTIES_AT)
        span = header_table_span(buf, _PROPERTIES_AT)
    if span is not None:
        properties[WIRE_HEADERS_PROPERTY] = bytes(buf[span[0] : span[1]])
    return class_id, body_size, properties


class FrameHandler:
    """py-amqp's ``frame_handler`` argument: its frame reader with :func:`decode_content_header`
    for the content header frame.

    It sits in the connection's ``transport_options``, which kombu reports: ``Connection.info()``
    is in ``celery inspect stats``, serialized as JSON, and connections are pickled. So it has a
    JSON form (its name, through kombu's ``__json__`` hook), pickles by reference and has a
    readable ``repr``.
    """

    def __call__(self, connection: amqp.Connection, callback: Callback) -> Callable[[Frame], bool]:
        return frame_reader(connection, callback, decode_content_header)

    def __json__(self) -> str:
        return "celery_dlx.broker.frames:frame_handler"

    def __repr__(self) -> str:
        return "<celery_dlx frame reader>"

    def __reduce__(self) -> str:
        return "frame_handler"


#: The frame reader celery_dlx's connections pass to py-amqp.
frame_handler = FrameHandler()


def tolerant(connection: Connection) -> Connection:
    """``connection`` (not yet connected, returned) with celery_dlx's frame reader when its
    transport is py-amqp."""
    if getattr(connection.transport, "driver_name", None) == "py-amqp":
        if connection.transport_options is None:
            connection.transport_options = {}
        connection.transport_options["frame_handler"] = frame_handler
    return connection


def connection_for(app: Celery, *, write: bool = False, chunked: bool = False) -> Connection:
    """A new connection to ``app``'s broker with celery_dlx's frame reader; ``chunked``: reading
    the socket in chunks (:mod:`celery_dlx.broker.buffered`), for a stream of deliveries."""
    connection = app.connection_for_write() if write else app.connection_for_read()
    return tolerant(buffered(connection) if chunked else connection)
