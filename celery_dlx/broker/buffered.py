"""Buffered socket reads for celery_dlx's own consuming connections (the DLX service's consumer).

py-amqp's ``TCPTransport`` reads each frame in three ``recv`` calls of exact sizes, so a delivery
(method, content header and body frames) costs nine system calls and as many buffer copies; a
backlog of small dead letters is mostly that. :class:`BufferedTransport` reads the socket in
chunks of up to ``CHUNK`` bytes and cuts the frames out of its buffer;
:meth:`BufferedTransport.has_frame` tells, without a system call, whether a whole frame is in
hand, so a consumer takes every buffered frame in one go (:func:`drain_buffered`). Only
connections made :func:`buffered` read this way (plain py-amqp, not TLS); the classes live in
:mod:`celery_dlx.compat.amqp` (py-amqp internals).
"""

from __future__ import annotations

import amqp
from kombu import Connection
from kombu.transport import pyamqp

from celery_dlx.compat.amqp import BufferedConnection, BufferedTransport, inbound_frame_handler

__all__ = ["BufferedAMQPTransport", "BufferedTransport", "buffered", "drain_buffered"]


class BufferedAMQPTransport(pyamqp.Transport):
    """kombu's py-amqp transport whose connections read in chunks (:class:`BufferedConnection`)."""

    Connection = BufferedConnection


def buffered(connection: Connection) -> Connection:
    """``connection`` reading in chunks: a clone on :class:`BufferedAMQPTransport` when its
    transport is kombu's plain py-amqp one; any other (TLS, a subclass...) as is."""
    if connection.get_transport_cls() is pyamqp.Transport and not connection.ssl:
        return connection.clone(transport=BufferedAMQPTransport)
    return connection


def drain_buffered(connection: amqp.Connection) -> int:
    """Handle every frame already buffered on ``connection`` (no system call); their count (0
    on a connection that does not read through :class:`BufferedTransport`)."""
    transport = connection.transport
    if not isinstance(transport, BufferedTransport):
        return 0
    # What ``blocking_read(None)`` does, without its socket-timeout context per frame: a
    # buffered frame needs no socket.
    handle = inbound_frame_handler(connection)
    frames = 0
    while transport.has_frame():
        handle(transport.read_frame())
        frames += 1
    return frames
