"""The Redis client of ``dlx_redis_url`` (plain, Sentinel or Cluster) and the round-trip helpers
that work on all three."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from redis import Redis
from redis.cluster import RedisCluster

#: A client of ``dlx_redis_url`` (a sentinel URL gives a plain ``Redis`` of the master); bytes
#: responses (``decode_responses`` is off).
RedisClient = Redis | RedisCluster


def is_cluster(client: RedisClient) -> bool:
    """True for a ``RedisCluster`` client (``dlx_redis_url`` with ``?cluster=true``)."""
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def run_script_many(
    client: RedisClient, script: Any, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
) -> list[Any]:
    """Run ``script`` once per ``(keys, args)`` of ``calls``; returns the replies in order.

    One pipelined round trip on a plain client. redis-py refuses scripts in a Redis Cluster
    pipeline, so there each call goes on its own (its keys share one hash tag, hence one slot).
    """
    if is_cluster(client):
        return [script(keys=list(keys), args=list(args)) for keys, args in calls]
    pipe = client.pipeline(transaction=False)
    for keys, args in calls:
        script(keys=list(keys), args=list(args), client=pipe)
    return list(pipe.execute())


def mget_many(client: RedisClient, *key_lists: Sequence[str]) -> list[list[Any]]:
    """``MGET`` of each key list (each within one hash tag), in one round trip where possible.

    redis-py refuses ``MGET`` in a Redis Cluster pipeline; there each list is its own ``MGET``.
    """
    if is_cluster(client):
        return [list(client.mget(list(keys))) if keys else [] for keys in key_lists]
    pipe = client.pipeline(transaction=False)
    for keys in key_lists:
        pipe.mget(list(keys))
    return [list(r) for r in pipe.execute()]


def redis_client(url: str) -> RedisClient:
    """A Redis client for ``url``: ``redis://``/``rediss://``/``unix://``, ``sentinel://host:port/
    service[/db]`` (several hosts separated by commas), or ``redis://...?cluster=true``."""
    from urllib.parse import parse_qs, urlparse

    parsed = urlparse(url)
    query = parse_qs(parsed.query)
    if parsed.scheme in ("sentinel", "sentinels"):
        from redis.sentinel import Sentinel

        hosts = []
        for part in parsed.netloc.split("@")[-1].split(","):
            host, _, port = part.partition(":")
            hosts.append((host or "127.0.0.1", int(port or 26379)))
        path = [p for p in parsed.path.split("/") if p]
        if not path:
            raise ValueError(f"sentinel URL needs a service name: {url}")
        db = int(path[1]) if len(path) > 1 else 0
        password = parsed.password
        # redis 8 leaves Sentinel's constructor and master_for unannotated.
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            hosts,
            socket_timeout=5.0,
            password=password,
            sentinel_kwargs={"password": password} if password else None,
        )
        master = sentinel.master_for(path[0], db=db, socket_timeout=5.0)  # type: ignore[no-untyped-call]
        return cast(Redis, master)
    if query.get("cluster", ["false"])[0].lower() in ("1", "true", "yes"):
        from redis.cluster import RedisCluster

        clean = url.split("?", 1)[0]
        return RedisCluster.from_url(clean)
    return Redis.from_url(
        url, socket_timeout=10.0, socket_connect_timeout=5.0, health_check_interval=30
    )
