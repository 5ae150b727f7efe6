"""celery_dlx's frame reader against py-amqp: what py-amqp raises on, what it relies on of py-amqp.

The reader is passed per connection (``amqp.Connection(frame_handler=...)``); py-amqp's own decoder
stays what it is for every other connection of the process.
"""

from __future__ import annotations

import inspect
import struct

import amqp
import pytest
from amqp import method_framing, serialization
from amqp.utils import bytes_to_str
from kombu import Connection

from celery_dlx.broker.frames import decode_content_header, frame_handler, tolerant
from celery_dlx.message.names import WIRE_HEADERS_PROPERTY


def header_payload(**properties: object) -> bytes:
    """A content header frame's payload: class, weight, body size, then the property list."""
    props = bytes(amqp.Message(b"body", **properties)._serialize_properties())
    return struct.pack(">HHQ", amqp.spec.Basic.CLASS_ID, 0, 4) + props


def test_py_amqp_alone_raises_on_a_non_utf8_message_id() -> None:
    frame = header_payload(message_id=b"\xff\xfe-id")
    with pytest.raises(UnicodeDecodeError):
        serialization.decode_properties_basic(frame, 12)


def test_the_reader_replaces_invalid_short_strings_and_keeps_header_names_as_py_amqp_does() -> None:
    frame = header_payload(
        message_id=b"\xff\xfe-id",
        content_type=b"text/\xff",
        application_headers={b"\xfe-name": 1, "ok": "v"},
    )
    class_id, size, props = decode_content_header(frame)
    assert (class_id, size) == (amqp.spec.Basic.CLASS_ID, 4)
    assert props["message_id"] == "\ufffd\ufffd-id"
    assert props["content_type"] == "text/\ufffd"
    assert props["application_headers"] == {b"\xfe-name": 1, "ok": "v"}
    assert WIRE_HEADERS_PROPERTY in props
    # nothing of py-amqp was replaced to get there
    assert serialization.pstr_t is bytes_to_str
    assert serialization.PROPERTY_CLASSES[amqp.spec.Basic.CLASS_ID] is (
        serialization.decode_properties_basic
    )


def test_the_reader_changes_nothing_that_decoded_before() -> None:
    frame = header_payload(
        message_id="m-1",
        content_type="application/json",
        application_headers={"x-death": [{"queue": "q", "count": 1}], "raw": b"\xff"},
    )
    _, _, props = decode_content_header(frame)
    raw = props.pop(WIRE_HEADERS_PROPERTY)
    assert (props, 0) == (serialization.decode_properties_basic(frame, 12)[0], 0)
    assert (
        raw
        == bytes(
            amqp.Message(
                b"", application_headers=props["application_headers"]
            )._serialize_properties()
        )[6:]
    )


def test_the_py_amqp_internals_the_reader_relies_on() -> None:
    """An upgrade of py-amqp that changes one of these fails here, not in production."""
    assert "frame_handler" in inspect.signature(amqp.Connection.__init__).parameters
    assert list(inspect.signature(method_framing.frame_handler).parameters)[:2] == [
        "connection",
        "callback",
    ]
    message = amqp.Message(frame_method=(60, 60), frame_args=b"")
    for attr in ("frame_method", "frame_args", "body_size", "ready", "properties"):
        assert hasattr(message, attr), attr
    assert callable(message.inbound_body)
    assert callable(message._serialize_properties)  # EncodedMessage overrides it


def test_the_py_amqp_internals_the_chunked_transport_relies_on() -> None:
    """celery_dlx.broker.buffered subclasses py-amqp's TCPTransport and Connection.Transport."""
    from amqp.transport import TCPTransport

    assert callable(TCPTransport._setup_transport)
    assert list(inspect.signature(amqp.Connection.Transport).parameters)[:7] == [
        "self",
        "host",
        "connect_timeout",
        "ssl",
        "read_timeout",
        "write_timeout",
        "socket_settings",
    ]
    init = inspect.signature(TCPTransport.__init__).parameters
    assert {"host", "connect_timeout", "read_timeout", "write_timeout", "socket_settings"} <= set(
        init
    )
    # blocking_read hands the frame read_frame gives to on_inbound_frame; drain_buffered does so.
    source = inspect.getsource(amqp.Connection.blocking_read)
    assert "self.transport.read_frame()" in source and "self.on_inbound_frame(frame)" in source
    transport = TCPTransport("localhost:5672")
    for attr in ("sock", "connected", "raise_on_initial_eintr"):
        assert hasattr(transport, attr), attr


def test_tolerant_sets_the_reader_on_py_amqp_connections_only() -> None:
    amqp_conn = tolerant(Connection("amqp://guest:guest@127.0.0.1:1//"))
    assert amqp_conn.transport_options["frame_handler"] is frame_handler
    memory = tolerant(Connection("memory://"))
    assert "frame_handler" not in (memory.transport_options or {})


def test_a_tolerant_connection_reports_and_pickles_as_any_other() -> None:
    """``celery inspect stats`` sends ``Connection.info()`` as JSON; kombu pickles connections."""
    import pickle

    from kombu.utils.json import dumps, loads

    conn = tolerant(Connection("amqp://guest:guest@127.0.0.1:1//"))
    info = loads(dumps(conn.info()))
    assert info["transport_options"]["frame_handler"] == "celery_dlx.broker.frames:frame_handler"
    assert pickle.loads(pickle.dumps(frame_handler)) is frame_handler
    assert pickle.loads(pickle.dumps(conn)).transport_options["frame_handler"] is frame_handler
