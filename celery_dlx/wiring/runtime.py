"""The composition root: one :class:`Runtime` per app hands out celery_dlx's roles
(:mod:`celery_dlx.roles`).

It makes the Redis client and broker connections lazily per process, so prefork children never
share a socket with their parent (fork safety lives here, in one place). Only this module and
``store/`` hold a Redis client or a key name; only this module and ``broker/`` a broker
connection.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence

from celery import Celery
from kombu import Connection

from celery_dlx import roles
from celery_dlx.broker.frames import connection_for
from celery_dlx.broker.ladder import Ladder, LadderParking
from celery_dlx.broker.publish import ConfirmingPublisher
from celery_dlx.errors import ConfigurationError
from celery_dlx.fates import FateEvent
from celery_dlx.message.memory import RedisMemory
from celery_dlx.message.names import Keys
from celery_dlx.message.outgoing import Outgoing
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.policy.config import DLXConfig, load_config
from celery_dlx.roles import Parking
from celery_dlx.store.breaker import Breakers
from celery_dlx.store.causes import Causes
from celery_dlx.store.client import (
    ClusterReplicas,
    OneConnection,
    RedisClient,
    Replicas,
    is_cluster_url,
    redis_client,
)
from celery_dlx.store.consumerless import Consumerless
from celery_dlx.store.graveyard import Budget, Graveyard
from celery_dlx.store.history import History
from celery_dlx.store.lease import DrainLease
from celery_dlx.store.memory import read_memory
from celery_dlx.store.migrate import Migration, migrate_graveyard, migrate_parked
from celery_dlx.store.parking import ParkingStore
from celery_dlx.store.ratelimit import WindowBudget
from celery_dlx.store.refusals import Refusals
from celery_dlx.store.seen import Letters
from celery_dlx.wiring.banner import redacted
from celery_dlx.wiring.recorder import FateRecorder, Listener, error_part

logger = logging.getLogger("celery_dlx")

__all__ = ["Listener", "Runtime", "error_part", "get_runtime"]


class Runtime:
    """celery_dlx's state for one Celery app."""

    def __init__(self, app: Celery, config: DLXConfig) -> None:
        self.app = app
        self.config = config
        self.keys = Keys(config.key_prefix)
        self.listeners: list[Listener] = []
        self.recorder = FateRecorder(
            parking=lambda: self.parking,
            history=lambda: self.history,
            publisher=lambda: self.publisher,
            reset_publisher=self.reset_publisher,
            listeners=self.listeners,
            history_optional=lambda: self.history_optional,
        )
        #: True while the drain cannot reach Redis (it logs once per outage).
        self.drain_failing = False
        self._pid: int | None = None
        self._redis: RedisClient | None = None
        self._publisher: ConfirmingPublisher | None = None
        self._connection: Connection | None = None
        self._ladder: Ladder | None = None
        # Per thread: the client of a replicated() block (one held connection), if any.
        self._local = threading.local()
        self._cluster_replicas = ClusterReplicas()
        self._store: ParkingStore | None = None
        self._graveyard: Graveyard | None = None
        #: The graveyard's budget (``dlx_graveyard_max_bytes``), shared by every client's
        #: graveyard of this process (it caches Redis' ``INFO memory``).
        self.graveyard_budget = Budget(config.graveyard_max_bytes)
        #: (pid, switch) of :meth:`follow_worker_events`.
        self._events_switch: tuple[int, Callable[[], bool]] | None = None

    def _check_fork(self) -> None:
        pid = os.getpid()
        if self._pid != pid:
            self._pid = pid
            self._redis = None
            self._publisher = None
            self._connection = None
            self._ladder = None
            self._store = None
            self._graveyard = None
            self._local = threading.local()

    @property
    def redis(self) -> RedisClient:
        """This process's Redis client for ``dlx_redis_url`` (inside :meth:`replicated`, this
        thread's client of the block's one connection)."""
        self._check_fork()
        pinned: RedisClient | None = getattr(self._local, "redis", None)
        return self._client() if pinned is None else pinned

    @contextlib.contextmanager
    def replicated(self, what: str) -> Iterator[None]:
        """A block whose Redis writes count only once ``dlx_redis_min_replicas`` replicas hold
        them: this thread's commands inside go over one connection to the master, and the block
        ends with ``WAIT`` on it (which also covers the parks inside). Without replicas to wait
        for, or inside another block, it changes nothing. The block's last write must be its
        caller's (``WAIT`` covers what the master received before its connection's last write).

        Raises:
            NotReplicated: ``what`` went to the master, but fewer replicas confirmed it.
        """
        self._check_fork()
        if getattr(self._local, "redis", None) is not None:
            yield
            return
        client = self.redis
        wanted = self.replicas.wanted(client, self.keys.parked_due)
        if not wanted:
            yield
            return
        with OneConnection(client, self.keys.parked_due) as one:
            self._local.redis = one.client
            try:
                yield
            finally:
                self._local.redis = None
            one.wait(wanted, self.replicas.timeout, what)

    @property
    def replicas(self) -> Replicas:
        """The Redis replicas a park must reach before it counts (``dlx_redis_min_replicas``,
        its default resolved for ``dlx_redis_url``; ``dlx_redis_replica_timeout``)."""
        config = self.config
        return Replicas.for_url(
            config.redis_url,
            config.redis_min_replicas,
            config.redis_replica_timeout,
            self._cluster_replicas,
        )

    @property
    def sharded(self) -> bool:
        """True when parked retries and obituaries have keys per queue (``dlx_redis_shards``:
        ``queue``, or ``auto`` on a Redis Cluster URL)."""
        shards = self.config.redis_shards
        return shards == "queue" or (shards == "auto" and is_cluster_url(self.config.redis_url))

    @property
    def store(self) -> roles.ParkedStore:
        """The Redis parking store (what :attr:`parking` reads and drains, whatever the backend),
        one per process (making it hashes its scripts). Inside :meth:`replicated` its parks wait
        for the block's ``WAIT``, except per queue (:attr:`sharded`): a queue's keys need not be
        on the block's master, so each bucket waits on its own."""
        return self._parking_store()

    def _in_block(self) -> bool:
        """True inside :meth:`replicated` in the single-tag layout: use the block's client."""
        return not self.sharded and getattr(self._local, "redis", None) is not None

    def _parking_store(self) -> ParkingStore:
        if self._in_block():
            return ParkingStore(self.redis, self.keys, Replicas(0))
        client = self._client()
        if self._store is None or self._store.client is not client:
            self._store = ParkingStore(client, self.keys, self.replicas, per_queue=self.sharded)
        return self._store

    def _client(self) -> RedisClient:
        """The process's client, never a :meth:`replicated` block's one connection."""
        self._check_fork()
        if self._redis is None:
            self._redis = redis_client(self.config.redis_url)
        return self._redis

    def migrate_keys(self, *, dry_run: bool = False) -> tuple[Migration, Migration]:
        """Move parked retries and obituaries from the single-tag layout to the keys of their
        queue (``dlx migrate-keys``, :mod:`celery_dlx.store.migrate`).

        Raises:
            ConfigurationError: ``dlx_redis_shards`` resolves to ``none`` (no other layout).
        """
        if not self.sharded:
            raise ConfigurationError(
                "dlx migrate-keys moves parked retries and obituaries to keys per queue, and "
                f"dlx_redis_shards is {self.config.redis_shards!r} on "
                f"{self.config.redis_url.split('@')[-1]}: "
                'set dlx_redis_shards = "queue" (or use a ?cluster=true URL with "auto") first'
            )
        return (
            migrate_parked(self._parking_store(), dry_run=dry_run),
            migrate_graveyard(self._yard(), dry_run=dry_run),
        )

    @property
    def parking(self) -> Parking:
        """Where parked retries wait: the Redis sorted set, or with ``dlx_delay_backend = "ttl"``
        the broker's delay queues (chosen here, once; nothing else asks which)."""
        if self.config.delay_backend == "ttl":
            return LadderParking(self.ladder, self._own_publisher, self._parking_store)
        return self._parking_store()

    @property
    def graveyard(self) -> roles.Graveyard:
        """Obituaries, one store per process (inside :meth:`replicated`, on the block's client)."""
        return self._yard()

    def _yard(self) -> Graveyard:
        cap = self.config.graveyard_max_per_cause
        if self._in_block():
            return Graveyard(self.redis, self.keys, budget=self.graveyard_budget, max_per_cause=cap)
        client = self._client()
        if self._graveyard is None or self._graveyard.client is not client:
            self._graveyard = Graveyard(
                client,
                self.keys,
                self.replicas,
                per_queue=self.sharded,
                budget=self.graveyard_budget,
                max_per_cause=cap,
            )
        return self._graveyard

    @property
    def causes(self) -> roles.Causes:
        return Causes(self.redis, self.keys)

    @property
    def breakers(self) -> roles.Breakers:
        """The per-cause breakers (``dlx_breaker``), shared through Redis by every worker."""
        return Breakers(self.redis, self.keys)

    @property
    def letters(self) -> roles.Letters:
        """The DLX service's seen markers and its batch lookup of cause records."""
        return Letters(self.redis, self.keys)

    @property
    def consumerless(self) -> roles.Consumerless:
        """Queues seen with messages and no consumer, and since when (``dlx check``)."""
        return Consumerless(self.redis, self.keys)

    @property
    def refusals(self) -> roles.Refusals:
        """The copies workers could not write, counted by the DLX service that wrote them."""
        return Refusals(self.redis, self.keys)

    def redis_memory(self, *, probe: bool = False) -> RedisMemory:
        """Redis' memory (the fullest master of a cluster); with ``probe``, a short-lived write
        tells whether Redis takes one now. Raises ``redis.RedisError`` when Redis did not answer."""
        return read_memory(self.redis, self.keys.check_probe if probe else None)

    def graveyard_limit(self) -> int | None:
        """The graveyard's budget in bytes (``dlx_graveyard_max_bytes``, by default a share of
        Redis' ``maxmemory``), or None for none.

        Raises:
            redis.RedisError: Redis did not answer (the default needs its ``maxmemory``).
        """
        budget = self.graveyard_budget
        limit = budget.limit(budget.memory(self.redis))
        return limit if limit >= 0 else None

    def ping_redis(self) -> None:
        """Ask Redis for an answer; ``redis.RedisError`` when it gives none."""
        self.redis.ping()

    def budget(self, name: str, limit: int, window: float) -> roles.WindowBudget:
        """A budget of ``limit`` uses per ``window`` seconds, shared by every process."""
        return WindowBudget(lambda: self.redis, self.keys, name, limit, window)

    def drain_lease(self, seconds: float, token: str) -> roles.DrainLease:
        """This process's hold on the drain lease of the app's key prefix."""
        return DrainLease(self.redis, self.keys.drain_lease, seconds, token)

    @property
    def ladder(self) -> Ladder:
        """This process's TTL delay-queue ladder (``dlx_ttl_ladder``, quorum per ``dlx_quorum``)."""
        self._check_fork()
        if self._ladder is None:
            self._ladder = Ladder(self.config.ttl_ladder, quorum=bool(self.config.quorum))
        return self._ladder

    def park(self, message: ParkedMessage) -> bool:
        """Park ``message`` until ``message.due_ms`` with the configured delay backend
        (:attr:`parking`); False when this message id and attempt were parked already."""
        return self.parking.park(message)

    @property
    def history_optional(self) -> bool:
        """True when the broker holds every fate (``dlx_delay_backend = "ttl"``)."""
        return bool(self.config.delay_backend == "ttl")

    def park_recorded(self, message: ParkedMessage, event: FateEvent) -> None:
        """:meth:`FateRecorder.park_recorded`."""
        self.recorder.park_recorded(message, event)

    def park_recorded_many(
        self, parks: Sequence[tuple[ParkedMessage, FateEvent]]
    ) -> list[BaseException | None]:
        """:meth:`FateRecorder.park_recorded_many`."""
        return self.recorder.park_recorded_many(parks)

    def follow_worker_events(self, switch: Callable[[], bool]) -> None:
        """In a worker's main process: ``switch`` says whether the worker sends task events now
        (``-E``, ``celery control enable_events``); fate events this process sends outside a
        task's run follow it."""
        self._events_switch = (os.getpid(), switch)

    def worker_sends_task_events(self) -> bool | None:
        """What the switch given to :meth:`follow_worker_events` says now; None outside workers
        and in any other process (a pool process inherits the switch, not its meaning)."""
        found = self._events_switch
        if found is None or found[0] != os.getpid():
            return None
        return bool(found[1]())

    def requeue_recorded_many(
        self,
        requeues: Sequence[tuple[Outgoing, FateEvent]],
        *,
        unrecorded: Callable[[Sequence[FateEvent]], None] | None = None,
    ) -> list[BaseException | None]:
        """:meth:`FateRecorder.requeue_recorded_many`."""
        return self.recorder.requeue_recorded_many(requeues, unrecorded=unrecorded)

    @contextlib.contextmanager
    def acting_for(self, node: str | None) -> Iterator[None]:
        """Within this block, fate changes this thread tells the listeners of are the worker
        ``node``'s (a worker's main process settling what its pool handed over); None changes
        nothing."""
        before = getattr(self._local, "node", None)
        self._local.node = node or before
        try:
            yield
        finally:
            self._local.node = before

    @property
    def acting_node(self) -> str | None:
        """The worker node name set by :meth:`acting_for` in this thread, if any."""
        node: str | None = getattr(self._local, "node", None)
        return node

    def record_settled(self, event: FateEvent) -> bool:
        """:meth:`FateRecorder.record_settled`."""
        return self.recorder.record_settled(event)

    @property
    def history(self) -> roles.History:
        """The failure history, the per-minute fate counters and the operators' audit stream."""
        return History(self.redis, self.keys)

    @property
    def publisher(self) -> roles.Publisher:
        """This process's confirm-mode publisher on its own broker connection."""
        return self._own_publisher()

    def _own_publisher(self) -> ConfirmingPublisher:
        self._check_fork()
        if self._publisher is None:
            self._connection = connection_for(self.app, write=True)
            self._publisher = ConfirmingPublisher(self._connection)
        return self._publisher

    def open_publisher(self) -> roles.Publisher:
        """A confirm-mode publisher on a connection of its own, which its ``close()`` releases
        (a DLX service's settling thread has one each)."""
        return ConfirmingPublisher(connection_for(self.app, write=True), owns_connection=True)

    def reset_publisher(self) -> None:
        """Drop the publisher (after a connection error) so the next use reconnects."""
        if self._publisher is not None:
            self._publisher.close()
        if self._connection is not None:
            try:
                self._connection.release()
            except Exception:  # a dead connection may fail to close
                logger.debug("releasing publisher connection failed", exc_info=True)
        self._publisher = None
        self._connection = None

    def record(self, event: FateEvent, *, history: bool = True) -> None:
        """:meth:`FateRecorder.record`."""
        self.recorder.record(event, history=history)

    def warm(self, *, listeners: bool = True) -> None:
        """Connect to Redis and the broker now (a pool process starting), and with ``listeners``
        the fate listeners that keep a connection; best effort (else on first use)."""
        try:
            self.parking.load_scripts()
        except Exception as exc:
            logger.warning(
                "celery_dlx could not reach Redis at dlx_redis_url=%s at start (%s: %s); will "
                "retry on use (dlx_redis_required = True makes a worker refuse to start instead)",
                redacted(self.config.redis_url),
                type(exc).__name__,
                exc,
            )
        try:
            self.publisher.connect()
            for listener in list(self.listeners) if listeners else ():
                warm = getattr(listener, "warm", None)
                if warm is not None:
                    warm()
        except Exception as exc:
            logger.warning(
                "celery_dlx could not reach the broker at start (%s); will retry on use", exc
            )

    def record_many(
        self, events: Sequence[FateEvent], *, history: bool = True, log: bool = True
    ) -> None:
        """:meth:`FateRecorder.record_many`."""
        self.recorder.record_many(events, history=history, log=log)

    def log_fates(self, events: Sequence[FateEvent]) -> None:
        """:meth:`FateRecorder.log_fates`."""
        self.recorder.log_fates(events)


def get_runtime(app: Celery) -> Runtime:
    """The app's runtime, made on first use from its validated ``dlx_*`` settings."""
    runtime: Runtime | None = app.__dict__.get("_celery_dlx_runtime")
    if runtime is None:
        config = load_config(app.conf, getattr(app, "namespace", None))
        # Reading app.conf may have configured the app just now, and install()'s configure hook
        # made the runtime (with its listeners) meanwhile: keep that one.
        runtime = app.__dict__.get("_celery_dlx_runtime")
        if runtime is None:
            runtime = Runtime(app, config)
            app.__dict__["_celery_dlx_runtime"] = runtime
    return runtime
