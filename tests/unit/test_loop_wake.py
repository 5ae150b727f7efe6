"""LoopWake on kombu's own event loop (a real ``Hub``, no broker): an ack queued from inside a
ready callback makes the loop's next poll return at once."""

from __future__ import annotations

import os
import select
import threading

from kombu.asynchronous import Hub

from celery_dlx.worker.loopwake import LoopWake


def _pipe_readable(wake: LoopWake) -> bool:
    return bool(select.select([wake._read_fd], [], [], 0)[0])


def test_an_ack_queued_in_a_ready_callback_ends_the_next_poll() -> None:
    hub = Hub()
    wake = LoopWake()
    try:
        wake.register(hub)
        ran: list[str] = []
        woken_by: list[set[int]] = []
        poll = hub.poller.poll

        def watched_poll(timeout: float) -> object:
            events = poll(timeout)
            woken_by.append({fd for fd, _ in events or ()})
            return events

        hub.poller.poll = watched_poll  # this test's own Hub instance only

        def ack() -> None:
            ran.append("ack")

        def run_inside_ready_callback() -> None:  # what a solo pool's run does
            hub.call_soon(ack)
            wake.nudge()

        hub.call_later(30.0, lambda: ran.append("timer"))  # the loop's next timer
        hub.call_soon(run_inside_ready_callback)
        loop = hub.create_loop()
        next(loop)  # runs the callback; its poll sees the pipe readable
        assert ran == []
        # the poll returned at once, on the pipe (else it waits for the timer), and read it
        assert woken_by == [{wake._read_fd}]
        assert not wake.armed
        next(loop)  # the next turn runs the ack
        assert ran == ["ack"]
    finally:
        wake.close(hub)
        hub.close()


def test_nudge_writes_once_per_turn_and_only_on_the_loop_thread() -> None:
    hub = Hub()
    wake = LoopWake()
    try:
        wake.register(hub)
        other = threading.Thread(target=wake.nudge)
        other.start()
        other.join()
        assert not wake.armed and not _pipe_readable(wake)  # call_soon wakes from there

        wake.nudge()
        wake.nudge()
        assert wake.armed
        assert os.read(wake._read_fd, 10) == b"\0"  # one byte for both
        wake._on_readable()  # the loop read it (nothing left: no error)
        assert not wake.armed
        wake.nudge()
        assert _pipe_readable(wake)
    finally:
        wake.close(hub)
        hub.close()


def test_close_removes_the_reader_and_closes_the_pipe() -> None:
    hub = Hub()
    wake = LoopWake()
    wake.register(hub)
    assert wake._read_fd in hub.readers
    wake.close(hub)
    assert wake._read_fd not in hub.readers
    for fd in (wake._read_fd, wake._write_fd):
        try:
            os.fstat(fd)
        except OSError:
            continue
        raise AssertionError(f"fd {fd} still open")
    hub.close()
