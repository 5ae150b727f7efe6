"""The version gates of celery_dlx.compat, each on both sides.

The installed release takes one side for real; the other side is taken by a stand-in shaped as
the other releases' API (the signatures below are copied from them). The matrix (tox.ini) runs
this file on the lowest and the newest releases, so each gate also meets its real other side.
"""

from __future__ import annotations

import threading
import time
import warnings
from importlib.metadata import version
from typing import Any

import kombu
import pytest
from kombu.asynchronous import Hub
from redis.connection import Connection, ConnectionPool
from redis.exceptions import TimeoutError as RedisTimeout

from celery_dlx import compat
from celery_dlx.worker.loopwake import LoopWake


def _release(dist: str) -> tuple[int, int]:
    major, minor = version(dist).split(".")[:2]
    return int(major), int(minor)


# -- redis-py: ConnectionPool.get_connection ------------------------------------------------------


class _PoolBefore53:
    """redis-py 5.0-5.2: ``get_connection(self, command_name, *keys, **options)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def get_connection(self, command_name: str, *keys: Any, **options: Any) -> str:
        self.calls.append((command_name, *keys))
        return "connection"


class _PoolFrom53:
    """redis-py 5.3+: the command name is optional, and deprecated (it warns when given)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def get_connection(self, command_name: str | None = None, *keys: Any, **options: Any) -> str:
        if command_name is not None or keys:
            warnings.warn("Use get_connection() without args", DeprecationWarning, stacklevel=2)
        self.calls.append((command_name, *keys))
        return "connection"


def test_pool_connection_names_a_command_only_where_redis_py_requires_one() -> None:
    old, new = _PoolBefore53(), _PoolFrom53()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compat.pool_connection(old) == "connection"
        assert compat.pool_connection(new) == "connection"
    assert old.calls == [("WAIT",)]
    assert new.calls == [(None,)]


def test_the_installed_redis_py_takes_the_side_its_release_says() -> None:
    requires = compat._requires_argument(ConnectionPool.get_connection, "command_name")
    assert requires == (_release("redis") < (5, 3)), version("redis")


# -- redis-py: Connection.read_response(timeout=) ------------------------------------------------


class _ConnectionBefore80:
    """redis-py before 8.0: no ``timeout`` on ``read_response``; ``can_read(timeout)`` polls."""

    def __init__(self, ready: bool) -> None:
        self.ready = ready
        self.polled: list[float] = []

    def can_read(self, timeout: float = 0) -> bool:
        self.polled.append(timeout)
        return self.ready

    def read_response(
        self, disable_decoding: bool = False, *, disconnect_on_error: bool = True
    ) -> int:
        return 2


class _ConnectionFrom80:
    """redis-py 8.0+: ``read_response(..., timeout=...)``."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def read_response(
        self, disable_decoding: bool = False, *, timeout: float = 0.0, **_: Any
    ) -> int:
        self.timeouts.append(timeout)
        return 3


def test_read_reply_passes_the_timeout_where_redis_py_takes_one() -> None:
    new = _ConnectionFrom80()
    assert compat.read_reply(new, 7.5) == 3
    assert new.timeouts == [7.5]


def test_read_reply_before_redis_py_8_polls_then_reads() -> None:
    ready = _ConnectionBefore80(ready=True)
    assert compat.read_reply(ready, 7.5) == 2
    assert ready.polled == [7.5]


def test_read_reply_before_redis_py_8_times_out_with_redis_py_s_error() -> None:
    silent = _ConnectionBefore80(ready=False)
    with pytest.raises(RedisTimeout, match=r"within 7\.5 seconds"):
        compat.read_reply(silent, 7.5)


def test_the_installed_redis_py_read_response_takes_the_side_its_release_says() -> None:
    takes = compat._accepts_keyword(Connection.read_response, "timeout")
    assert takes == (_release("redis") >= (8, 0)), version("redis")


# -- kombu: call_soon from another thread --------------------------------------------------------


def test_the_installed_kombu_takes_the_side_its_release_says() -> None:
    wakes = compat.hub_wakes_for_other_threads()
    assert wakes == (tuple(kombu.VERSION[:2]) >= (5, 7)), kombu.__version__


def test_an_ack_queued_from_another_thread_is_run_at_once_on_either_side() -> None:
    """kombu 5.7+ wakes its loop itself; before, LoopWake's pipe does (``other_threads``)."""
    hub = Hub()
    wake = LoopWake(other_threads=not compat.hub_wakes_for_other_threads())
    acked = threading.Event()
    try:
        wake.register(hub)
        hub.call_later(30.0, lambda: None)  # the loop's next timer: its polls wait up to 10 s
        loop = hub.create_loop()
        next(loop)  # the loop is set up and idle

        def settler() -> None:  # what the settler thread (or a threads-pool run) does
            time.sleep(0.2)
            hub.call_soon(acked.set)
            wake.nudge()

        thread = threading.Thread(target=settler)
        started = time.monotonic()
        thread.start()
        while not acked.is_set() and time.monotonic() - started < 15:
            next(loop)
        thread.join()
        assert acked.is_set()
        assert time.monotonic() - started < 3, "the ack waited for the loop's timer"
    finally:
        wake.close(hub)
        hub.close()


def test_other_threads_write_the_pipe_only_when_asked() -> None:
    for other_threads in (False, True):
        hub = Hub()
        wake = LoopWake(other_threads=other_threads)
        try:
            wake.register(hub)
            thread = threading.Thread(target=wake.nudge)
            thread.start()
            thread.join()
            assert wake.armed is other_threads
        finally:
            wake.close(hub)
            hub.close()
