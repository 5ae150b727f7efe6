"""The Redis client of ``dlx_redis_url`` (plain, Sentinel or Cluster), the round-trip helpers
that work on all three, and writes that count only once replicas have them (``WAIT``).

Redis replicates asynchronously: a write the master acknowledged is lost if it fails over to a
replica that had not received it. :func:`execute_replicated` sends a pipeline then ``WAIT`` on
the same connection (``WAIT`` counts the replicas holding its own connection's writes, and
redis-py lends each command a pooled connection), and raises :class:`NotReplicated` when too
few replicas confirmed them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qs, urlparse

from redis import Redis
from redis.client import Pipeline
from redis.cluster import RedisCluster
from redis.exceptions import AskError, NoScriptError, RedisError

from celery_dlx.compat.redis import HeldConnectionPool, held_client, read_reply, refresh_slot_map
from celery_dlx.errors import StoreError

#: A client of ``dlx_redis_url`` (a sentinel URL gives a plain ``Redis`` of the master); bytes
#: responses (``decode_responses`` is off).
RedisClient = Redis | RedisCluster


def text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def is_cluster(client: RedisClient) -> bool:
    return isinstance(client, RedisCluster)


def run_script_many(
    client: RedisClient, script: Any, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
) -> list[Any]:
    """Run ``script`` once per ``(keys, args)`` of ``calls``, pipelined (on a Redis Cluster,
    whose pipeline redis-py gives no scripts, one call at a time); the replies in order."""
    if is_cluster(client):
        return [script(keys=list(keys), args=list(args)) for keys, args in calls]
    pipe = client.pipeline(transaction=False)
    for keys, args in calls:
        script(keys=list(keys), args=list(args), client=pipe)
    return list(pipe.execute())


def batched_script(body: str) -> str:
    """A script running ``body`` once per call of a batch: ``ARGV[1]`` and ``ARGV[2]`` are how
    many keys and arguments each call has, then come each call's in turn; the replies in a list.
    """
    return f"""
local function one(KEYS, ARGV)
{body}
end
local nk, na = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {{}}
for i = 0, #KEYS / nk - 1 do
  local k, a = {{}}, {{}}
  for j = 1, nk do k[j] = KEYS[i * nk + j] end
  for j = 1, na do a[j] = ARGV[2 + i * na + j] end
  out[#out + 1] = one(k, a)
end
return out
"""


def run_script_batch(
    script: Any, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
) -> list[Any]:
    """Run ``script`` (a :func:`batched_script`) once for all of ``calls`` (``(keys, args)``,
    every key in one hash tag); the replies in order. One command instead of one per call: the
    client packs and parses one, the server runs one script.

    Raises:
        ValueError: the calls differ in their numbers of keys or arguments.
    """
    if not calls:
        return []
    nk, na = len(calls[0][0]), len(calls[0][1])
    if nk == 0:
        raise ValueError("a batched script call needs at least one key per call")
    keys: list[Any] = []
    args: list[Any] = [nk, na]
    for call_keys, call_args in calls:
        if len(call_keys) != nk or len(call_args) != na:
            raise ValueError("every call of a batched script has the same numbers of keys and args")
        keys += call_keys
        args += call_args
    return list(script(keys=keys, args=args))


def mget_many(client: RedisClient, *key_lists: Sequence[str]) -> list[list[Any]]:
    """``MGET`` of each key list (each within one hash tag) in one round trip (one each on a
    Redis Cluster, whose pipeline redis-py gives no ``MGET``)."""
    if is_cluster(client):
        return [list(client.mget(list(keys))) if keys else [] for keys in key_lists]
    pipe = client.pipeline(transaction=False)
    for keys in key_lists:
        pipe.mget(list(keys))
    return [list(r) for r in pipe.execute()]


@dataclass(frozen=True)
class MemoryInfo:
    """What ``INFO memory`` says: bytes used, ``maxmemory`` (0: none) and its policy."""

    used: int
    maxmemory: int
    policy: str


def memory_info(client: RedisClient) -> MemoryInfo:
    """Redis' ``INFO memory`` (on a Cluster, the node redis-py asks by default)."""
    info: dict[str, Any] = client.info("memory")
    if is_cluster(client) and info and all(isinstance(v, dict) for v in info.values()):
        info = next(iter(info.values()))  # per node: the first answers for the budget
    return MemoryInfo(
        used=int(info.get("used_memory", 0)),
        maxmemory=int(info.get("maxmemory", 0)),
        policy=str(info.get("maxmemory_policy", "")),
    )


SENTINEL_SCHEMES = ("sentinel", "sentinels")

#: Seconds a ``WAIT`` reply may take beyond its own timeout (a busy server) before the read fails.
WAIT_READ_MARGIN = 5.0
#: Seconds a Redis Cluster master's count of replicas is used before it is read again.
TOPOLOGY_TTL = 60.0


def is_cluster_url(url: str) -> bool:
    """True for a Redis Cluster URL (``...?cluster=true``)."""
    query = parse_qs(urlparse(url).query)
    return query.get("cluster", ["false"])[0].lower() in ("1", "true", "yes")


def is_sentinel_url(url: str) -> bool:
    return urlparse(url).scheme in SENTINEL_SCHEMES


class NotReplicated(StoreError, RedisError):
    """Fewer replicas than ``dlx_redis_min_replicas`` confirmed a write within
    ``dlx_redis_replica_timeout``: a failover could lose it, so it does not count as done (a
    ``RedisError``, so callers take it as "not now", like an outage)."""

    def __init__(self, what: str, wanted: int, confirmed: int, timeout: float) -> None:
        super().__init__(
            f"{what} reached {confirmed} of the {wanted} Redis replica(s) dlx_redis_min_replicas "
            f"asks for within {timeout:g}s (dlx_redis_replica_timeout); not counted as done, so "
            "the message stays in RabbitMQ. A replica is lagging or down; set "
            "dlx_redis_min_replicas = 0 only where Redis has no replica to fail over to"
        )
        self.wanted = wanted
        self.confirmed = confirmed


class ClusterReplicas:
    """How many replicas each Redis Cluster master has, as ``CLUSTER NODES`` on it says (read
    again after :data:`TOPOLOGY_TTL` seconds): it lists replicas whatever their state, so a
    lagging or failed one still counts (redis-py's slot map, ``CLUSTER SLOTS``, leaves those out).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[int, tuple[float, int]] = {}

    def count(self, master: Redis) -> int:
        pool_id = id(master.connection_pool)
        now = time.monotonic()
        with self._lock:
            known = self._known.get(pool_id)
        if known is not None and now - known[0] < TOPOLOGY_TTL:
            return known[1]
        node: Any = master  # redis-py leaves execute_command unannotated
        found = _replicas_in_table(node.execute_command("CLUSTER NODES"))
        with self._lock:
            self._known[pool_id] = (now, found)
        return found


def _replicas_in_table(table: Any) -> int:
    """Nodes of a ``CLUSTER NODES`` reply (text, or redis-py's dict) replicating ``myself``."""
    if isinstance(table, dict):
        rows = [(str(n["node_id"]), str(n["flags"]), str(n["master_id"])) for n in table.values()]
    else:
        text = table.decode() if isinstance(table, bytes) else str(table)
        rows = [
            (parts[0], parts[2], parts[3])
            for parts in (line.split(" ") for line in text.splitlines())
            if len(parts) >= 4
        ]
    mine = next((node_id for node_id, flags, _ in rows if "myself" in flags.split(",")), None)
    return sum(1 for _, _, master_id in rows if mine is not None and master_id == mine)


@dataclass(frozen=True)
class Replicas:
    """How many replicas must hold a write before it counts as done, and how long to wait.

    Args:
        count: ``dlx_redis_min_replicas`` (0: no ``WAIT``); None: on a Redis Cluster, one where
            the key's master has a replica in the node table, else none (nothing to fail over to).
        timeout: ``dlx_redis_replica_timeout``, seconds.
        topology: where the replicas of cluster masters are looked up (one per client).
    """

    count: int | None = 0
    timeout: float = 1.0
    topology: ClusterReplicas = field(default_factory=ClusterReplicas, compare=False)

    @classmethod
    def for_url(
        cls, url: str, count: int | None, timeout: float, topology: ClusterReplicas | None = None
    ) -> Replicas:
        """``count`` for ``url``; None is the default: 1 behind Sentinel, one per replicated
        master on a Cluster, 0 on one node."""
        if count is None and not is_cluster_url(url):
            count = 1 if is_sentinel_url(url) else 0
        return cls(count, timeout, topology or ClusterReplicas())

    def wanted(self, client: RedisClient, key: str) -> int:
        """How many replicas must confirm a write of ``key`` on ``client``.

        Raises:
            redis.RedisError: a Redis Cluster's node table could not be read.
        """
        if self.count is not None:
            return self.count
        if not is_cluster(client):
            return 0
        return min(1, self.topology.count(master_of(client, key)))


def master_of(client: RedisClient, key: str) -> Redis:
    """The plain client of the master holding ``key``: ``client``, or on a Redis Cluster the
    node owning the key's slot (redis-py's cluster client sends ``WAIT`` to its default node,
    whichever master holds the key)."""
    if not is_cluster(client):
        assert isinstance(client, Redis)
        return client
    assert isinstance(client, RedisCluster)
    cluster: Any = client  # redis-py leaves get_node_from_key unannotated
    node = cluster.get_node_from_key(key)
    if node.redis_connection is None:
        refresh_slot_map(client)
        node = cluster.get_node_from_key(key)
    return cast(Redis, node.redis_connection)


class OneConnection:
    """One connection to the master holding ``key`` (every key the block touches must share
    its slot), lent to a plain client until the ``with`` block ends, so that :meth:`wait` counts
    the replicas holding everything the block wrote. Closed when the block ends with an error
    (the next one asks Sentinel for the master again).
    """

    def __init__(self, client: RedisClient, key: str) -> None:
        self._origin = client
        self._held = HeldConnectionPool(master_of(client, key).connection_pool)
        #: A plain client whose every command goes over the held connection.
        self.client = held_client(self._held)

    def __enter__(self) -> OneConnection:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, AskError) and isinstance(self._origin, RedisCluster):
            refresh_slot_map(self._origin)  # MOVED or ASK: the slot map is stale
        self._held.close(broken=exc is not None)

    def wait(self, wanted: int, timeout: float, what: str) -> None:
        """``WAIT wanted timeout`` on the held connection.

        Raises:
            NotReplicated: fewer replicas confirmed the writes (``what`` names them).
        """
        connection = self._held.connection
        connection.send_command("WAIT", wanted, max(1, round(timeout * 1000)))
        confirmed = int(read_reply(connection, timeout + WAIT_READ_MARGIN))
        if confirmed < wanted:
            raise NotReplicated(what, wanted, confirmed, timeout)


def execute_replicated(
    client: RedisClient,
    key: str,
    queue: Callable[[Pipeline], object],
    wanted: int,
    timeout: float,
    *,
    what: str,
) -> list[Any]:
    """Run the commands ``queue`` adds to a pipeline, then ``WAIT`` for ``wanted`` replicas for
    up to ``timeout`` seconds, on the same connection (:class:`OneConnection`).

    Raises:
        NotReplicated: the writes went to the master but fewer replicas confirmed them.
        redis.RedisError: the pipeline or the ``WAIT`` failed (the caller retries).
    """
    with OneConnection(client, key) as one:
        pipe = one.client.pipeline(transaction=False)
        queue(pipe)
        results = list(pipe.execute())
        one.wait(wanted, timeout, what)
    return results


def execute_loading(pipe: Any, client: RedisClient, scripts: Mapping[str, str]) -> list[Any]:
    """Execute ``pipe``: the replies in order, an error in place of a command Redis refused.
    Its scripts go as bare ``EVALSHA`` (``scripts``: sha -> source), without redis-py's ``SCRIPT
    EXISTS`` round trip; one answered ``NOSCRIPT`` (Redis restarted) runs again by ``EVAL``.

    Raises:
        redis.RedisError: the pipeline was not sent, or a transaction was discarded.
    """
    # A Cluster pipeline (its commands are objects, not tuples) is given no script calls.
    sent = [args for args, _ in pipe.command_stack] if isinstance(pipe, Pipeline) else []
    replies = list(pipe.execute(raise_on_error=False))
    for i, reply in enumerate(replies):
        if isinstance(reply, NoScriptError):
            _, sha, *args = sent[i]
            try:
                replies[i] = client.eval(scripts[sha], *args)
            except RedisError as exc:
                replies[i] = exc
    return replies


def redis_client(url: str) -> RedisClient:
    """A Redis client for ``url``: ``redis://``/``rediss://``/``unix://``, ``sentinel://host:port/
    service[/db]`` (several hosts separated by commas), or ``redis://...?cluster=true``."""
    parsed = urlparse(url)
    if parsed.scheme in SENTINEL_SCHEMES:
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
    if is_cluster_url(url):
        clean = url.split("?", 1)[0]
        return RedisCluster.from_url(clean)
    return Redis.from_url(
        url, socket_timeout=10.0, socket_connect_timeout=5.0, health_check_interval=30
    )
