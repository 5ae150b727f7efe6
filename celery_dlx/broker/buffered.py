"""Buffered socket reads for celery_dlx's own consuming connections (the DLX service's consumer).

py-amqp's ``TCPTransport`` reads each frame in three ``recv`` calls of exact sizes (the frame
header, the payload, the frame-end octet), so a delivery (method, content header and body frames)
costs nine system calls and as many buffer copies; a backlog of small dead letters is mostly that.
:class:`BufferedTransport` reads the socket in chunks of up to :data:`CHUNK` bytes and cuts the
frames out of its buffer; :meth:`BufferedTransport.has_frame` tells, without a system call, whether
a whole frame is already in hand, so a consumer can take every buffered frame in one go
(:func:`drain_buffered`).

Only connections celery_dlx makes :func:`buffered` get it: kombu's py-amqp transport with
:class:`BufferedConnection` as its connection class, a subclass in celery_dlx's own code. py-amqp's
classes are not changed, and no other connection of the process reads this way. TLS connections
(py-amqp's ``SSLTransport``) and other transports are left as they are. The py-amqp internals a
transport subclass relies on (``_setup_transport``, ``sock``, ``read_frame`` as
``blocking_read`` calls it, ``Connection.Transport``'s arguments, ``on_inbound_frame``) are
checked against the installed py-amqp in ``tests/unit/test_amqp_compat.py``.
"""

from __future__ import annotations

import errno
from struct import unpack_from
from typing import Any

import amqp
from amqp.exceptions import UnexpectedFrame
from amqp.transport import TCPTransport
from kombu import Connection
from kombu.transport import pyamqp

#: Most bytes one ``recv`` reads (the default ``frame_max`` of RabbitMQ is 128 KiB).
CHUNK = 1 << 17
#: ``errno`` values of a read that would block (a socket in non-blocking mode) or was interrupted.
_RETRY = (errno.EAGAIN, errno.EINTR)
#: ``errno`` values after which the connection may still be usable (as py-amqp's ``_UNAVAIL``).
_UNAVAIL = (errno.EAGAIN, errno.EINTR, errno.ENOENT, errno.EWOULDBLOCK)
#: The octet that ends every AMQP frame.
_FRAME_END = 0xCE


class BufferedTransport(TCPTransport):
    """py-amqp's plain TCP transport, reading the socket in chunks.

    A frame is consumed from the buffer only once it is whole, so a read that times out (or fails)
    midway leaves the bytes received so far in the buffer, and the next read goes on from there.
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
    """kombu's py-amqp connection class with :class:`BufferedTransport` for plain TCP."""

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
                host,
                connect_timeout,
                ssl=ssl,
                read_timeout=read_timeout,
                write_timeout=write_timeout,
                socket_settings=socket_settings,
                **kwargs,
            )
        return BufferedTransport(
            host,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            socket_settings=socket_settings,
            **kwargs,
        )


class BufferedAMQPTransport(pyamqp.Transport):
    """kombu's py-amqp transport whose connections read in chunks (:class:`BufferedConnection`)."""

    Connection = BufferedConnection


def buffered(connection: Connection) -> Connection:
    """``connection`` reading in chunks: a copy of it (kombu's ``clone``, not yet connected) on
    :class:`BufferedAMQPTransport` when its transport is kombu's plain py-amqp one; any other
    (TLS, another transport, a user's subclass) is returned as it is."""
    if connection.get_transport_cls() is pyamqp.Transport and not connection.ssl:
        return connection.clone(transport=BufferedAMQPTransport)
    return connection


def drain_buffered(connection: amqp.Connection) -> int:
    """Handle every frame already buffered on ``connection`` (no system call); their count.

    Does nothing on a connection that does not read through :class:`BufferedTransport`.
    """
    transport = connection.transport
    if not isinstance(transport, BufferedTransport):
        return 0
    # What ``blocking_read(None)`` does, without its socket-timeout context per frame: a
    # buffered frame needs no socket.
    handle = connection.on_inbound_frame
    frames = 0
    while transport.has_frame():
        handle(transport.read_frame())
        frames += 1
    return frames
