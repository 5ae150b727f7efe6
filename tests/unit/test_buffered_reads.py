"""celery_dlx's chunked frame reads (the DLX service's consumer), over a local socket pair.

The transport must hand over exactly the frames py-amqp's would, however the bytes arrive (one
byte at a time, many frames in one read, a read that times out midway), and leave every other
connection of the process as py-amqp makes it.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest
from amqp.exceptions import UnexpectedFrame
from amqp.transport import TCPTransport
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu import Connection
from kombu.transport import pyamqp

from celery_dlx.broker.buffered import (
    BufferedAMQPTransport,
    BufferedTransport,
    buffered,
)


def frame(frame_type: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


@pytest.fixture
def pair() -> Iterator[tuple[BufferedTransport, socket.socket]]:
    ours, theirs = socket.socketpair()
    transport = BufferedTransport("localhost:5672")  # never connects: the socket is set below
    transport.sock = ours
    transport._setup_transport()
    transport.connected = True
    try:
        yield transport, theirs
    finally:
        ours.close()
        theirs.close()


FRAMES = st.lists(
    st.tuples(st.sampled_from([1, 2, 3, 8]), st.integers(0, 65535), st.binary(max_size=300)),
    min_size=1,
    max_size=20,
)


@settings(max_examples=60, deadline=None)
@given(frames=FRAMES, cuts=st.lists(st.integers(1, 97), min_size=1, max_size=40))
def test_frames_come_out_whole_and_in_order_however_the_bytes_arrive(
    frames: list[tuple[int, int, bytes]], cuts: list[int]
) -> None:
    ours, theirs = socket.socketpair()
    try:
        transport = BufferedTransport("localhost:5672")
        transport.sock = ours
        transport._setup_transport()
        ours.settimeout(5)
        wire = b"".join(frame(*f) for f in frames)
        got = []
        sent = 0
        steps = iter(cuts * len(wire))
        while sent < len(wire):
            step = next(steps)
            theirs.sendall(wire[sent : sent + step])
            sent += step
            transport._fill()  # one read: exactly the piece just sent (a socket pair keeps it whole)
            while transport.has_frame():
                got.append(transport.read_frame())
        assert got == frames
        assert not transport.has_frame()
    finally:
        ours.close()
        theirs.close()


def test_a_read_that_times_out_midway_keeps_what_arrived(
    pair: tuple[BufferedTransport, socket.socket],
) -> None:
    transport, theirs = pair
    whole = frame(3, 1, b"x" * 1000)
    theirs.sendall(whole[:500])
    transport.sock.settimeout(0.05)  # type: ignore[union-attr]
    with pytest.raises(TimeoutError):
        transport.read_frame()
    assert not transport.has_frame()
    theirs.sendall(whole[500:])
    assert transport.read_frame() == (3, 1, b"x" * 1000)


def test_many_frames_in_one_read_need_no_more_reads(
    pair: tuple[BufferedTransport, socket.socket],
) -> None:
    transport, theirs = pair
    theirs.sendall(frame(1, 1, b"method") + frame(2, 1, b"header") + frame(3, 1, b"body"))
    assert transport.read_frame() == (1, 1, b"method")  # the one read brought all three
    theirs.close()  # a further read would now fail: these two come from the buffer
    assert transport.has_frame()
    assert transport.read_frame() == (2, 1, b"header")
    assert transport.read_frame() == (3, 1, b"body")
    assert not transport.has_frame()
    with pytest.raises(OSError, match="unexpectedly closed"):
        transport.read_frame()
    assert transport.connected is False


def test_a_frame_without_its_end_octet_is_refused(
    pair: tuple[BufferedTransport, socket.socket],
) -> None:
    transport, theirs = pair
    theirs.sendall(frame(1, 1, b"method", end=0x00))
    with pytest.raises(UnexpectedFrame, match="0x00"):
        transport.read_frame()


def test_only_plain_py_amqp_connections_read_in_chunks() -> None:
    plain = Connection("amqp://guest:guest@localhost:5672//", heartbeat=7)
    chunked = buffered(plain)
    assert chunked.get_transport_cls() is BufferedAMQPTransport
    assert (chunked.hostname, chunked.port, chunked.heartbeat) == ("localhost", 5672, 7)
    assert plain.get_transport_cls() is pyamqp.Transport  # a copy: the original is left alone
    tls = Connection("amqp://guest:guest@localhost:5671//", ssl=True)
    assert buffered(tls) is tls
    memory = Connection("memory://")
    assert buffered(memory) is memory
    # py-amqp's own classes are untouched: every other connection reads as before.
    assert pyamqp.Transport.Connection is pyamqp.Connection
    assert "Transport" not in vars(pyamqp.Connection)
    assert TCPTransport.read_frame is not BufferedTransport.read_frame
