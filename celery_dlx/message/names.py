"""Header names, Redis key layout and default broker names, gathered in one place."""

from __future__ import annotations

#: Header carrying the number of failed runs before this delivery (0 on the first delivery).
ATTEMPT_HEADER = "x-dlx-attempt"
#: Header carrying how many requeues this message has used.
REQUEUES_HEADER = "x-dlx-requeues"
#: Header carrying how many parks this message has used.
PARKS_HEADER = "x-dlx-parks"
#: Header carrying the attempt history: a JSON list of ``[ms, fate, cause]`` (capped).
HISTORY_HEADER = "x-dlx-history"
#: Header naming the queue the message failed in (the queue a retry returns to).
QUEUE_HEADER = "x-dlx-queue"
#: Header with the fingerprint of the last failure's cause.
CAUSE_HEADER = "x-dlx-cause"
#: Header with the last failure's exception type (``module.QualName``).
EXC_TYPE_HEADER = "x-dlx-exc-type"
#: Header with the last failure's exception message (truncated).
EXC_MESSAGE_HEADER = "x-dlx-exc-message"
#: Header with the reason a message was buried by publishing rather than by reject.
REASON_HEADER = "x-dlx-reason"
#: Header set on messages republished from the graveyard.
REPLAYED_HEADER = "x-dlx-replayed"
#: Header with the first failure's time, in epoch milliseconds (a decimal string on the wire).
FIRST_FAILURE_HEADER = "x-dlx-first-failure-ms"
#: Header with the identity celery_dlx gave the copies of a message that had no ``message_id``.
IDENTITY_HEADER = "x-dlx-id"
#: Header on a copy held by an open breaker (``dlx_breaker``): the cause it is held for.
HELD_HEADER = "x-dlx-held"
#: Header on a held copy: how many times it was held (each hold's parking entry is distinct).
HOLDS_HEADER = "x-dlx-holds"

#: Header on a copy a DLX worker sent to the dead-letter exchange because it could not carry out
#: the fate it decided (``parked`` or ``requeued``); the DLX service carries it out.
FATE_HEADER = "x-dlx-fate"
#: Header with the park delay (seconds, a decimal string) of a ``parked`` :data:`FATE_HEADER` copy.
DELAY_HEADER = "x-dlx-delay"

#: The headers of a message's failure state (:func:`~celery_dlx.message.headers.read_state`); a
#: message with none of them has the empty state.
STATE_HEADERS = frozenset(
    {
        ATTEMPT_HEADER,
        REQUEUES_HEADER,
        PARKS_HEADER,
        HISTORY_HEADER,
        QUEUE_HEADER,
        FIRST_FAILURE_HEADER,
        CAUSE_HEADER,
        EXC_TYPE_HEADER,
        EXC_MESSAGE_HEADER,
    }
)
#: Every header celery_dlx owns: a replay drops them unless ``--keep-attempts``.
OWN_HEADERS = STATE_HEADERS | {
    REASON_HEADER,
    REPLAYED_HEADER,
    IDENTITY_HEADER,
    HELD_HEADER,
    HOLDS_HEADER,
    FATE_HEADER,
    DELAY_HEADER,
}

#: Broker-owned header prefixes stripped from every message celery_dlx republishes.
BROKER_HEADER_PREFIXES = ("x-death", "x-first-death-", "x-last-death-")
#: Broker-owned headers stripped on republish (quorum queues count deliveries in this one).
BROKER_HEADERS = frozenset({"x-delivery-count"})

#: How many entries of attempt history a message carries.
HISTORY_LIMIT = 20
#: Longest exception message carried in a header.
EXC_MESSAGE_LIMIT = 500

#: Default name of the dead-letter exchange every DLX queue routes to.
DEFAULT_DLX_EXCHANGE = "celery_dlx"
#: Default name of the queue the DLX service consumes.
DEFAULT_SERVICE_QUEUE = "celery_dlx.dead"
#: Default Redis key prefix; always wrapped in ``{}`` so every key shares one Redis Cluster slot.
DEFAULT_KEY_PREFIX = "dlx"


def default_exchange(prefix: str = DEFAULT_KEY_PREFIX) -> str:
    """The dead-letter exchange of an app that does not set ``dlx_exchange``: ``celery_dlx``, or
    ``celery_dlx.<prefix>`` for a key prefix of its own (two apps on one vhost stay apart)."""
    return (
        DEFAULT_DLX_EXCHANGE if prefix == DEFAULT_KEY_PREFIX else f"{DEFAULT_DLX_EXCHANGE}.{prefix}"
    )


#: Consumer tags of DLX services start with this, then ``<key prefix>:<host>:<pid>``, so the
#: management API shows which app's service consumes a queue.
SERVICE_TAG_PREFIX = "celery_dlx.service:"


def service_consumer_tag(prefix: str, host: str, pid: int) -> str:
    """The consumer tag of a DLX service of the app with key prefix ``prefix``."""
    return f"{SERVICE_TAG_PREFIX}{prefix}:{host}:{pid}"


def service_tag_prefix(tag: str) -> str | None:
    """The key prefix a DLX service's consumer tag names, or None for any other consumer."""
    if tag.startswith(SERVICE_TAG_PREFIX):
        return tag[len(SERVICE_TAG_PREFIX) :].split(":", 1)[0] or None
    return None


def default_service_queue(prefix: str = DEFAULT_KEY_PREFIX) -> str:
    """The DLX service queue of an app that does not set ``dlx_service_queue``:
    ``celery_dlx.dead``, or ``celery_dlx.<prefix>.dead`` for a key prefix of its own."""
    if prefix == DEFAULT_KEY_PREFIX:
        return DEFAULT_SERVICE_QUEUE
    return f"{DEFAULT_DLX_EXCHANGE}.{prefix}.dead"


#: Buckets of one queue's parked retries with ``dlx_redis_shards = "queue"`` (CRC-32 of the entry
#: id modulo this). Fixed: changing it would strand entries in buckets nothing reads.
PARKED_BUCKETS = 8


class Keys:
    """Redis key names for one prefix; each starts with the hash tag ``{prefix}``, so Lua scripts
    touching several keys work on Redis Cluster."""

    def __init__(self, prefix: str = DEFAULT_KEY_PREFIX) -> None:
        if not prefix or any(c in prefix for c in "{} "):
            raise ValueError(
                f"dlx_key_prefix must be non-empty without braces or spaces: {prefix!r}"
            )
        self.prefix = prefix
        base = "{" + prefix + "}"
        legacy = ParkedKeys(base)
        #: The keys of :attr:`parked_legacy` (:class:`ParkedKeys` says what each holds).
        self.parked_due, self.parked_meta, self.parked_body = legacy.due, legacy.meta, legacy.body
        #: Stream: the failure history, one entry per fate change (``spark/dlx_source.py`` too).
        self.history = f"{base}:history"
        #: Hash: the Spark export's checkpoint (``spark/dlx_stream.py``, tested equal).
        self.history_export = f"{self.history}:export"
        #: String: the Spark export's lock (``spark/dlx_stream.py``, likewise).
        self.history_export_lock = f"{self.history}:export:lock"
        #: Graveyard keys (obituaries and their indexes).
        self.graveyard_prefix = f"{base}:graveyard:"
        #: Hash per epoch minute: fate counters per queue (``store/counters.py`` formats them).
        self.counter_prefix = f"{base}:count:"
        #: String per message identity already handled by the DLX service (dedup of redeliveries).
        self.seen_prefix = f"{base}:seen:"
        self.replay_ledger = f"{base}:replay:ledger"
        #: Hash: queue -> epoch ms a ``check`` first saw it with messages and no consumer.
        self.consumerless = f"{base}:check:consumerless"
        #: String: written (expiring at once) by ``check`` to learn whether Redis takes a write.
        self.check_probe = f"{base}:check:probe"
        #: Hash: fate -> copies workers could not write that the DLX service wrote for them.
        self.refused = f"{base}:refused"
        #: Stream: the web console's audit log (who did what, when, with which result).
        self.web_audit = f"{base}:web:audit"
        #: String: the token of the worker whose drainer holds the drain lease (with a TTL).
        self.drain_lease = f"{base}:drain:lease"
        #: Set: the queues whose parked retries have keys of their own (:meth:`parked_shard`).
        self.parked_queues = f"{base}:parked:queues"
        #: Sorted set of the open breakers (``QUEUE\tCAUSE`` -> opened ms); each has a state hash
        #: and a held set (:meth:`breaker_state`, :meth:`breaker_held`).
        self.breakers_open = f"{base}:breaker:open"

    @property
    def home_tag(self) -> str:
        """The app's hash tag, ``{prefix}``: every key of the single-tag layout."""
        return "{" + self.prefix + "}"

    def queue_tag(self, queue: str, bucket: int) -> str:
        """The hash tag of one bucket of ``queue``'s keys, ``{prefix:q:QUEUE:BUCKET}``, so a
        Redis Cluster spreads them over its masters."""
        return "{" + f"{self.prefix}:q:{queue}:{bucket}" + "}"

    def parked_shard(self, queue: str, bucket: int) -> ParkedKeys:
        """The parked-retry keys of one bucket of ``queue``."""
        return ParkedKeys(self.queue_tag(queue, bucket))

    @property
    def parked_legacy(self) -> ParkedKeys:
        """The parked-retry keys of the single-tag layout (every queue under ``{prefix}``)."""
        return ParkedKeys(self.home_tag)

    def breaker_state(self, member: str) -> str:
        """The state hash of one breaker (``member`` is ``QUEUE\tCAUSE``)."""
        return f"{self.home_tag}:breaker:state:{member}"

    def breaker_held(self, member: str) -> str:
        """The set of parked entry ids one open breaker holds."""
        return f"{self.home_tag}:breaker:held:{member}"

    def cause(self, message_id: str) -> str:
        """String: the cause of a burial known only to the worker (read by the service)."""
        return f"{self.home_tag}:cause:{message_id}"

    def graveyard(self, suffix: str) -> str:
        return f"{self.graveyard_prefix}{suffix}"

    def counter(self, minute: int) -> str:
        """The counters' hash of one epoch minute."""
        return f"{self.counter_prefix}{minute}"

    def seen(self, identity: str) -> str:
        """The DLX service's marker of one handled dead letter."""
        return f"{self.seen_prefix}{identity}"

    def copied(self, queue: str, message_id: str, attempt: int) -> str:
        """The marker of a requeued copy of ``message_id`` in ``queue`` at ``attempt``: a
        redelivered original whose ack was lost after the copy went out is not a crash."""
        return f"{self.home_tag}:copied:{queue}:{message_id}:{attempt}"

    def run(self, step: str) -> str:
        """The marker of one run of a retried copy (``step``: message id, attempt, fate time): a
        second copy of the same step (its writer died between publish and delete) is not run."""
        return f"{self.home_tag}:run:{step}"

    def requeued_by_task(self, message_id: str) -> str:
        """The marker of a task's own ``Reject(requeue=True)``: its redelivery is not a crash."""
        return f"{self.home_tag}:requeued-by-task:{message_id}"

    def budget(self, name: str) -> str:
        """The prefix of one rate-limit budget's keys (Sentry events per cause...)."""
        return f"{self.home_tag}:budget:{name}:"


class ParkedKeys:
    """The three keys of one set of parked retries, all of an app's or one queue's, under one
    hash tag (one Cluster slot, for the parking store's Lua scripts)."""

    def __init__(self, base: str) -> None:
        self.base = base
        #: Sorted set: entry id -> due time (ms); a claimed entry is re-scored to its lease end.
        self.due = f"{base}:parked:due"
        #: Hash: entry id -> JSON metadata.
        self.meta = f"{base}:parked:meta"
        #: Hash: entry id -> raw body bytes.
        self.body = f"{base}:parked:body"


#: Header the worker's main process adds to a delivery, naming the queue it was consumed from
#: (a fanout or topic delivery's routing key does not name it). Never carried by a copy.
DELIVERY_QUEUE_HEADER = "x-dlx-delivered-from"

#: Key celery_dlx's frame reader adds to a delivery's properties (never sent): the raw content of
#: its header table, so a copy writes each user header back as its producer encoded it.
WIRE_HEADERS_PROPERTY = "x-dlx-wire-headers"
#: Key added to a delivery's properties when its property list could not be decoded: the reason.
UNDECODABLE_PROPERTY = "x-dlx-undecodable"
#: Key added with :data:`UNDECODABLE_PROPERTY`: the property list's raw bytes (a quarantine copy
#: carries them in the header of the same name).
RAW_PROPERTIES_PROPERTY = "x-dlx-raw-properties"
