"""How full celery_dlx's Redis is, as ``INFO`` says, and whether it takes a write now.

Read by ``celery dlx check`` and ``/metrics``: ``INFO memory``, ``INFO errorstats``
(``errorstat_OOM``: writes refused for memory) and one tiny write that expires at once (a full
Redis with ``noeviction`` refuses it). On a Redis Cluster the fullest master is reported.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from redis.exceptions import OutOfMemoryError, ReadOnlyError, RedisError

from celery_dlx.message.memory import RedisMemory
from celery_dlx.store.client import RedisClient, is_cluster

__all__ = ["PROBE_TTL_MS", "RedisMemory", "read_memory"]

#: Milliseconds the probe key lives (it is written only to learn whether a write is taken).
PROBE_TTL_MS = 1000


def _int(info: dict[str, Any], name: str) -> int:
    try:
        return int(info.get(name) or 0)
    except (TypeError, ValueError):
        return 0


def _oom_count(errorstats: dict[str, Any]) -> int:
    """``errorstat_OOM:count=N`` as redis-py parses it (a dict), or as text."""
    stat = errorstats.get("errorstat_OOM")
    if isinstance(stat, dict):
        return _int(stat, "count")
    if isinstance(stat, str) and stat.startswith("count="):
        return _int({"c": stat.split("=", 1)[1].split(",", 1)[0]}, "c")
    return 0


def _probe(server: Any, key: str) -> tuple[bool, str | None]:
    """Whether Redis takes a write now, and its refusal if not."""
    try:
        server.set(key, b"1", px=PROBE_TTL_MS)
    except (OutOfMemoryError, ReadOnlyError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return True, None


def _read(server: Any, probe_key: str | None, node: str, **target: Any) -> RedisMemory:
    memory = server.info("memory", **target)
    try:
        errorstats = server.info("errorstats", **target)
    except RedisError:  # Redis < 6.2 has no errorstats
        errorstats = {}
    writable, refusal = _probe(server, probe_key) if probe_key is not None else (None, None)
    policy = memory.get("maxmemory_policy") or ""
    return RedisMemory(
        used=_int(memory, "used_memory"),
        maxmemory=_int(memory, "maxmemory"),
        policy=policy.decode() if isinstance(policy, bytes) else str(policy),
        refused_writes=_oom_count(errorstats),
        writable=writable,
        refusal=refusal,
        node=node,
    )


def read_memory(client: RedisClient, probe_key: str | None = None) -> RedisMemory:
    """The memory of ``client``'s server (the fullest master of a cluster); ``probe_key``: a
    key to write to learn whether Redis takes a write now (None: no write).

    Raises:
        redis.RedisError: Redis did not answer (a refused probe write is not an error).
    """
    if not is_cluster(client):
        return _read(client, probe_key, "")
    fullest: RedisMemory | None = None
    for node in client.get_primaries():  # type: ignore[union-attr]
        # A probe key of its own per master would need a slot of that master: the probe is
        # written through the cluster client to the key's own master only.
        mem = _read(client, None, node.name, target_nodes=node)
        if fullest is None or (mem.share or 0) > (fullest.share or 0):
            fullest = mem
    assert fullest is not None
    if probe_key is None:
        return fullest
    writable, refusal = _probe(client, probe_key)
    return replace(fullest, writable=writable, refusal=refusal)
