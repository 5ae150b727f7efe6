"""py-amqp internals celery_dlx relies on, for its own connections only: none changes py-amqp for
any other connection of the process (checked on py-amqp 5.4.2, installed here and the lowest
release ``setup.cfg`` allows).

Canaries: ``tests/unit/test_amqp_compat.py`` (signatures and sources of what each relies on) and
``tests/unit/test_compat.py`` (py-amqp section).
"""

from __future__ import annotations

import errno
from collections import defaultdict
from collections.abc import Callable
from struct import unpack_from
from typing import Any

import amqp
from amqp import spec
from amqp.exceptions import UnexpectedFrame
from amqp.serialization import decode_properties_basic
from amqp.transport import TCPTransport
from kombu.transport import pyamqp

#: Most bytes one ``recv`` reads (the default ``frame_max`` of RabbitMQ is 128 KiB).
CHUNK = 1 << 17
#: ``errno`` values of a read that would block (a socket in non-blocking mode) or was interrupted.
_RETRY = (errno.EAGAIN, errno.EINTR)
#: ``errno`` values after which the connection may still be usable (as py-amqp's ``_UNAVAIL``).
_UNAVAIL = (errno.EAGAIN, errno.EINTR, errno.ENOENT, errno.EWOULDBLOCK)
#: The octet that ends every AMQP frame.
_FRAME_END = 0xCE

#: Methods whose frame is followed by a content header and body.
_CONTENT_METHODS = frozenset({spec.Basic.Return, spec.Basic.Deliver, spec.Basic.GetOk})

Frame = tuple[int, int, Any]
Callback = Callable[[int, tuple[int, int], Any, Any], Any]
#: ``(class id, body size, properties)`` of a content header frame's payload.
HeaderDecoder = Callable[[bytes], tuple[int, int, dict[str, object]]]


# -- the chunked transport --------------------------------------------------------------------------


class BufferedTransport(TCPTransport):
    """py-amqp's plain TCP transport, reading the socket in chunks.

    Counted gain (callgrind, ``benchmarks/tricks_io.py --part consume``): a consumer of P6 dead
    letters (prefetch 1,000, celery_dlx's frame reader) executes 223,258 instructions per
    delivery with it against 321,994 with py-amqp's ``TCPTransport`` (-31% of the consume path;
    the kernel's work in the ``recv`` calls it saves is not in the count).

    A frame is consumed from the buffer only once it is whole, so a read that times out (or fails)
    midway leaves the bytes received so far in the buffer, and the next read goes on from there.

    Internals: py-amqp's ``TCPTransport`` (not documented for subclassing): its
    ``_setup_transport`` (called once connected), ``sock``, ``raise_on_initial_eintr``,
    ``connected``, ``read_frame`` as ``Connection.blocking_read`` calls it, and ``_read(n)`` for
    the protocol header.
    """

    _buf: bytes
    _pos: int

    def _setup_transport(self) -> None:
        super()._setup_transport()  # type: ignore[misc]  # missing from py-amqp's stubs
        self._buf = b""
        self._pos = 0

    def has_frame(self) -> bool:
        """True when a whole frame is buffered: the next :meth:`read_frame` makes no system call."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 7:
            return False
        size: int = unpack_from(">I", buf, pos + 3)[0]
        return len(buf) > pos + 7 + size

    def read_frame(self, unpack: Any = None) -> tuple[int, int, bytes]:
        """The next frame: ``(type, channel, payload)``.

        Raises:
            socket.timeout: nothing whole arrived within the socket's timeout.
            UnexpectedFrame: the frame does not end with the frame-end octet.
            OSError: the socket failed or the server closed it.
        """
        while True:
            buf, pos = self._buf, self._pos
            if len(buf) - pos >= 7:
                frame_type, channel, size = unpack_from(">BHI", buf, pos)
                end = pos + 7 + size
                if len(buf) > end:
                    if buf[end] != _FRAME_END:
                        raise UnexpectedFrame(
                            f"Received frame_end {buf[end]:#04x} while expecting 0xce"
                        )
                    self._pos = end + 1
                    return frame_type, channel, buf[pos + 7 : end]
            self._fill()

    def _read(self, n: int, initial: bool = False) -> bytes:
        """Exactly ``n`` bytes (py-amqp's reading API; its frame reader is :meth:`read_frame`)."""
        while len(self._buf) - self._pos < n:
            self._fill()
        pos = self._pos
        self._pos = pos + n
        return self._buf[pos : pos + n]

    def _fill(self) -> None:
        """Append what the socket has (at least one byte, at most :data:`CHUNK`) to the buffer."""
        sock = self.sock
        assert sock is not None, "not connected"
        while True:
            try:
                data = sock.recv(CHUNK)
            except TimeoutError:
                raise
            except OSError as exc:
                if exc.errno in _RETRY:
                    if self.raise_on_initial_eintr:  # nothing consumed: safe to report a timeout
                        raise TimeoutError() from exc
                    continue
                if exc.errno not in _UNAVAIL:
                    self.connected = False
                raise
            if not data:
                self.connected = False
                raise OSError("Server unexpectedly closed connection")
            pos = self._pos
            self._buf = (self._buf[pos:] + data) if pos else (self._buf + data)
            self._pos = 0
            return


class BufferedConnection(pyamqp.Connection):
    """kombu's py-amqp connection class with :class:`BufferedTransport` for plain TCP.

    Internal: py-amqp's ``Connection.Transport(host, connect_timeout, ssl, read_timeout,
    write_timeout, socket_settings, **kwargs)``, the factory its ``__init__`` calls for the
    transport (not documented as a hook).
    """

    def Transport(  # py-amqp's name
        self,
        host: str,
        connect_timeout: float | None,
        ssl: Any = False,
        read_timeout: float | None = None,
        write_timeout: float | None = None,
        socket_settings: Any = None,
        **kwargs: Any,
    ) -> Any:
        if ssl:
            return super().Transport(
                host, connect_timeout, ssl, read_timeout, write_timeout, socket_settings, **kwargs
            )
        return BufferedTransport(
            host, connect_timeout, read_timeout, write_timeout, socket_settings, **kwargs
        )


def inbound_frame_handler(connection: amqp.Connection) -> Callable[[Frame], Any]:
    """The callable ``connection`` hands each frame it reads to (its frame handler's).

    Internal: ``amqp.Connection.on_inbound_frame``, what ``blocking_read`` calls with each frame
    the transport reads.
    """
    handle: Callable[[Frame], Any] = connection.on_inbound_frame
    return handle


# -- the frame reader -------------------------------------------------------------------------------


def decode_properties(buf: bytes, offset: int) -> tuple[dict[str, Any], int]:
    """py-amqp's decoding of the basic property list at ``offset`` of ``buf``:
    ``(properties, offset after them)``.

    Internal: ``amqp.serialization.decode_properties_basic``, what py-amqp's own frame handler
    decodes a content header with.

    Raises:
        Exception: whatever py-amqp raises on a list it cannot decode.
    """
    properties, end = decode_properties_basic(buf, offset)
    return properties, end


def frame_reader(
    connection: amqp.Connection, callback: Callback, decode_header: HeaderDecoder
) -> Callable[[Frame], bool]:
    """py-amqp's ``method_framing.frame_handler`` with ``decode_header`` for the content header
    frame (a copy of it: py-amqp's decodes the header inside, with no way to replace that part).

    Internals: the frame handler's contract (``frame_handler(connection, callback)`` returns a
    function of ``(type, channel, payload)`` that returns True when a method is complete), the
    count ``connection.bytes_recv`` that heartbeats read, and ``amqp.Message``'s framing
    (``frame_method``, ``frame_args``, ``body_size``, ``ready``, ``inbound_body``).
    """
    expected_types: defaultdict[int, int] = defaultdict(lambda: 1)
    partial_messages: dict[int, Any] = {}  # amqp.Message (celery-types omits its frame API)

    def on_frame(frame: Frame) -> bool:
        frame_type, channel, buf = frame
        connection.bytes_recv += 1
        if frame_type not in (expected_types[channel], 8):
            raise UnexpectedFrame(
                f"Received frame {frame_type} while expecting type: {expected_types[channel]}"
            )
        if frame_type == 1:
            method_sig = unpack_from(">HH", buf, 0)
            if method_sig in _CONTENT_METHODS:
                partial_messages[channel] = amqp.Message(frame_method=method_sig, frame_args=buf)
                expected_types[channel] = 2
                return False
            callback(channel, method_sig, buf, None)
        elif frame_type == 2:
            msg = partial_messages[channel]
            _class_id, msg.body_size, msg.properties = decode_header(buf)
            if msg.body_size:
                expected_types[channel] = 3
                return False
            msg.ready = True
            expected_types[channel] = 1
            partial_messages.pop(channel, None)
            callback(channel, msg.frame_method, msg.frame_args, msg)
        elif frame_type == 3:
            msg = partial_messages[channel]
            msg.inbound_body(buf)
            if not msg.ready:
                return False
            expected_types[channel] = 1
            partial_messages.pop(channel, None)
            callback(channel, msg.frame_method, msg.frame_args, msg)
        elif frame_type == 8:
            return False
        return True

    return on_frame


# -- publishing -------------------------------------------------------------------------------------


class EncodedMessage(amqp.Message):
    """An ``amqp.Message`` whose property list celery_dlx encoded itself
    (:func:`~celery_dlx.message.fieldtable.write_properties`): py-amqp sends those bytes as they
    are. ``properties`` still holds the decoded view (headers included) for readers.

    Internal: ``GenericContent._serialize_properties``, which py-amqp's frame writer
    (``method_framing.frame_writer``) calls for a published message's property list; py-amqp has
    no public option to send a list encoded elsewhere.
    """

    def __init__(self, body: bytes, encoded_properties: bytes, **properties: object) -> None:
        super().__init__(body, **properties)
        self.encoded_properties = encoded_properties

    def _serialize_properties(self) -> bytes:
        return self.encoded_properties
