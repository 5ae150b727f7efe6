"""redis-py internals celery_dlx relies on, and its version gates (checked on redis-py 8.1.0,
installed here, and 5.0.0, the lowest stack's in ``tests/constraints/lowest.txt``, by reading its
sources; the gates name the releases where behaviour changes).

Canaries: ``tests/unit/test_compat_versions.py`` (both sides of each gate) and
``tests/unit/test_compat_canaries.py`` (redis-py section).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from redis import Redis


@functools.cache
def _requires_argument(function: Callable[..., object], name: str) -> bool:
    parameter = inspect.signature(function).parameters.get(name)
    return parameter is not None and parameter.default is inspect.Parameter.empty


@functools.cache
def _accepts_keyword(function: Callable[..., object], name: str) -> bool:
    return name in inspect.signature(function).parameters


def pool_connection(pool: Any) -> Any:
    """A connection from redis-py's connection ``pool`` (given back with ``pool.release``).

    Version gate (redis-py 5.0.0-8.1.0 checked): before 5.3, ``ConnectionPool.get_connection``
    requires a command name (which it ignores); from 5.3 the name is deprecated and warns.
    """
    if _requires_argument(type(pool).get_connection, "command_name"):
        return pool.get_connection("WAIT")
    return pool.get_connection()


def read_reply(connection: Any, timeout: float) -> Any:
    """The next reply on redis-py ``connection``, waiting at most ``timeout`` seconds for it.

    Version gate (redis-py 5.0.0-8.1.0 checked): ``Connection.read_response(timeout=)`` is new in
    redis-py 8.0; before, ``can_read(timeout)`` waits for the reply, then ``read_response()``
    reads it (with the connection's own socket timeout, the reply being there already).

    Raises:
        redis.TimeoutError: no reply within ``timeout`` seconds.
    """
    if _accepts_keyword(type(connection).read_response, "timeout"):
        return connection.read_response(timeout=timeout)
    if not connection.can_read(timeout=timeout):
        from redis.exceptions import TimeoutError as RedisTimeout

        raise RedisTimeout(f"no reply from Redis within {timeout:g} seconds")
    return connection.read_response()


class HeldConnectionPool:
    """A stand-in for a redis-py ``ConnectionPool`` that lends the one connection it holds to one
    thread: a ``Redis(connection_pool=...)`` over it sends every command, pipelines included, on it.

    Internal: what a client asks of its pool (``get_connection``, ``release``, and attributes
    such as ``connection_kwargs``, ``get_encoder``, passed on to the real pool), undocumented.
    ``WAIT`` counts the replicas holding its own connection's writes, and redis-py's public
    ``single_connection_client`` does not hold the connection for pipelines.
    """

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.connection: Any = pool_connection(pool)

    def get_connection(self, *_args: Any, **_kwargs: Any) -> Any:
        return self.connection

    def release(self, _connection: Any) -> None:
        """Kept until :meth:`close`."""

    def close(self, *, broken: bool) -> None:
        if broken:  # replies may be left unread, or the master it reached may be a stale one
            self.connection.disconnect()
        self.pool.release(self.connection)

    def __getattr__(self, name: str) -> Any:  # encoder, connection kwargs...: the pool's
        return getattr(self.pool, name)


def held_client(held: HeldConnectionPool) -> Redis:
    """A plain ``Redis`` client whose every command, pipelines included, goes over ``held``'s
    connection (a :class:`HeldConnectionPool` standing in for its ``ConnectionPool``)."""
    from redis import Redis
    from redis.connection import ConnectionPool

    return Redis(connection_pool=cast(ConnectionPool, held))


def refresh_slot_map(cluster: Any) -> None:
    """Make a ``RedisCluster`` client read the cluster's slot map again (after a ``MOVED`` or
    ``ASK``, or when the node of a key has no connection yet).

    Internal: ``RedisCluster.nodes_manager.initialize()``, what redis-py itself calls when it
    follows a redirection; the cluster client has no public method for it.
    """
    cluster.nodes_manager.initialize()
