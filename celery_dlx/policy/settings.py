"""Every ``dlx_*`` setting: its default, its validation and what it means (:data:`SETTINGS`).

:mod:`celery_dlx.policy.config` reads them from ``app.conf`` into a typed :class:`DLXConfig`;
``docs/gen_config.py`` writes the configuration reference from this table.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypedDict

from celery_dlx.docs_url import doc_url
from celery_dlx.errors import ConfigurationError
from celery_dlx.message.names import DEFAULT_DLX_EXCHANGE, DEFAULT_KEY_PREFIX, DEFAULT_SERVICE_QUEUE
from celery_dlx.policy import durations
from celery_dlx.policy.breaker import BreakerSettings, parse_breaker
from celery_dlx.policy.decide import Backoff, parse_backoff

#: Task importances: ``page`` wakes someone, ``notify`` tells them later, ``ignore`` sends nothing.
IMPORTANCES = ("page", "notify", "ignore")
#: Ways to delay a parked retry.
DELAY_BACKENDS = ("redis", "ttl")
#: Values of ``dlx_redis_shards``: auto (queue on a Redis Cluster URL, none elsewhere), queue, none.
REDIS_SHARDS = ("auto", "queue", "none")
#: What to do with a message that died of TTL expiry.
EXPIRED_ACTIONS = ("park", "bury")


def closest(names: Iterable[str], known: Iterable[str]) -> str:
    """``" (did you mean X?)"`` for misspelt ``names`` that have a close known name (``difflib``;
    with several, ``name -> X`` for each that has one); empty when none is close."""
    wrong, choices = list(names), list(known)
    hints = []
    for name in wrong:
        found = difflib.get_close_matches(name.lower(), choices, n=1, cutoff=0.75)
        if found:
            hints.append(found[0] if len(wrong) == 1 else f"{name} -> {found[0]}")
    return f" (did you mean {', '.join(hints)}?)" if hints else ""


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise ConfigurationError(f"{name} must be a boolean, got {value!r}")


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def _positive_count(name: str, value: object) -> int:
    number = _count(name, value)
    if number == 0:
        raise ConfigurationError(f"{name} must be a positive integer, got 0")
    return number


def _optional_count(name: str, value: object) -> int | None:
    return None if value is None else _positive_count(name, value)


def _seconds(name: str, value: object) -> float:
    return durations.duration(value, name)


def _str(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _optional_str(name: str, value: object) -> str | None:
    return None if value is None else _str(name, value)


def _choice(choices: tuple[str, ...]) -> Callable[[str, object], str]:
    def check(name: str, value: object) -> str:
        if value not in choices:
            raise ConfigurationError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
        return str(value)

    return check


def _str_list(name: str, value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigurationError(f"{name} must be a list of strings, got {value!r}")
    return tuple(_str(f"{name}[{i}]", v) for i, v in enumerate(value))


#: A host name or IPv4 address, ``*.`` and a domain (any name under it), or ``[IPv6]``.
_HOST_PATTERN = re.compile(r"(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*|\[[0-9a-f:.]+\]")


def _host_patterns(name: str, value: object) -> tuple[str, ...]:
    patterns = []
    for i, text in enumerate(_str_list(name, value)):
        pattern = text.lower()
        if pattern == "*":
            raise ConfigurationError(
                f"{name}[{i}] is '*', which would let a DNS-rebinding page in: name the hosts "
                "(a domain's subdomains as '*.corp.example')"
            )
        if not _HOST_PATTERN.fullmatch(pattern):
            raise ConfigurationError(
                f"{name}[{i}] must be a host name, '*.domain' or IP address ([...] for IPv6) "
                f"without scheme, port or path, e.g. 'dlx.example.com'; got {text!r}"
            )
        patterns.append(pattern)
    return tuple(patterns)


def _key_prefix(name: str, value: object) -> str:
    text = _str(name, value)
    if any(c in text for c in "{} \t\n"):
        raise ConfigurationError(f"{name} must not contain braces or white space, got {text!r}")
    return text


# Named validators: docs/gen_config.py documents a setting's kind by its validator's name.
def _ladder(name: str, value: object) -> tuple[float, ...]:
    return durations.ladder(value, name)


def _backoff(name: str, value: object) -> Backoff:
    return parse_backoff(value, name)


def _breaker(name: str, value: object) -> BreakerSettings | None:
    return parse_breaker(value, name)


#: Keys allowed in one entry of ``dlx_queues`` (policy for a queue, also foreign queues).
QUEUE_POLICY_KEYS = ("backoff", "max_requeues", "max_parks", "importance", "expired", "breaker")


class QueuePolicy(TypedDict, total=False):
    """One validated entry of ``dlx_queues``: what it refines for its queue."""

    backoff: Backoff
    max_requeues: int
    max_parks: int
    importance: str
    expired: str
    breaker: BreakerSettings | None


def _queue_policies(name: str, value: object) -> dict[str, QueuePolicy]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"{name} must map queue names to policies, got {value!r}")
    out: dict[str, QueuePolicy] = {}
    for queue, spec in value.items():
        where = f"{name}[{queue!r}]"
        if not isinstance(spec, Mapping):
            raise ConfigurationError(f"{where} must be a mapping, got {spec!r}")
        unknown = set(spec) - set(QUEUE_POLICY_KEYS)
        if unknown:
            hint = closest(sorted(map(str, unknown)), QUEUE_POLICY_KEYS)
            raise ConfigurationError(
                f"{where} has unknown keys {sorted(unknown)}{hint}; allowed: "
                f"{', '.join(QUEUE_POLICY_KEYS)}"
            )
        checks = {key: SETTINGS[f"dlx_{key}"].check for key in QUEUE_POLICY_KEYS}
        checked = {key: checks[key](f"{where}[{key!r}]", spec[key]) for key in spec}
        out[str(queue)] = QueuePolicy(**checked)  # type: ignore[typeddict-item]
    return out


@dataclass(frozen=True)
class Setting:
    """One ``dlx_*`` setting: its default, its validator and its documentation."""

    name: str
    default: object
    check: Callable[[str, object], object]
    doc: str


#: Every setting celery_dlx reads. docs/configuration.md is checked against this table.
SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "dlx_enabled",
            False,
            _bool,
            "Make every task of the app a DLX task, declare the topology, run the drain in the workers.",
        ),
        Setting(
            "dlx_redis_url",
            "redis://127.0.0.1:6379/0",
            _str,
            "Redis for parked retries, graveyard and history (redis://, rediss://, sentinel://, or a cluster URL with ?cluster=true).",
        ),
        Setting(
            "dlx_redis_required",
            False,
            _bool,
            "A worker whose Redis (dlx_redis_url) does not answer at start refuses to start "
            "(exit 1) instead of starting with a warning and parking nothing until it answers.",
        ),
        Setting(
            "dlx_redis_min_replicas",
            None,  # the URL's default; not validated unless set
            _count,
            "Redis replicas that must confirm a park (`WAIT`) before its message is acked; fewer "
            "fail the park and the message stays in RabbitMQ. Unset (None): 1 behind Sentinel "
            "(sentinel://), 1 on a Redis Cluster master that has replicas, 0 on one node.",
        ),
        Setting(
            "dlx_redis_replica_timeout",
            1.0,
            _seconds,
            "Seconds a park waits for dlx_redis_min_replicas replicas to confirm it.",
        ),
        Setting(
            "dlx_redis_shards",
            "auto",
            _choice(REDIS_SHARDS),
            "How parked retries and obituaries are spread over Redis Cluster slots: auto (the "
            "default: queue on a ?cluster=true URL, none elsewhere), queue (8 hash tags per queue "
            "for parked retries, 4 of them for obituaries, {prefix:q:QUEUE:BUCKET}, so a cluster "
            "spreads them over its masters), or none (every key under {prefix}: one slot, one "
            "master). After a change to queue, `dlx migrate-keys` moves what the old layout "
            f"holds (it is read meanwhile). See {doc_url('operations')}.",
        ),
        Setting(
            "dlx_key_prefix",
            DEFAULT_KEY_PREFIX,
            _key_prefix,
            "Prefix of every Redis key, wrapped in {} (a hash tag: one Redis Cluster slot), but "
            "parked retries and obituaries sharded by queue (dlx_redis_shards) under "
            "{prefix:q:QUEUE:BUCKET}.",
        ),
        Setting(
            "dlx_max_requeues",
            2,
            _count,
            "Requeues at the tail before a failure escalates to parking.",
        ),
        Setting("dlx_max_parks", 5, _count, "Parked (delayed) retries before a message is buried."),
        Setting(
            "dlx_backoff",
            {"base": 10.0, "factor": 2.0, "max": 3600.0, "jitter": 0.1},
            _backoff,
            "Delay before each parked retry: list of seconds, {base, factor, max, jitter}, or a callable of the park index.",
        ),
        Setting(
            "dlx_drain_interval",
            1.0,
            _seconds,
            "Seconds between drains of due parked retries (the drainer in the workers and the DLX service).",
        ),
        Setting(
            "dlx_drain_batch", 500, _positive_count, "Most parked retries one drain claims at once."
        ),
        Setting(
            "dlx_drain_lease",
            30.0,
            _seconds,
            "Seconds a claimed retry is reserved for one drain before another may claim it.",
        ),
        Setting(
            "dlx_importance",
            "notify",
            _choice(IMPORTANCES),
            "Default task importance: page, notify or ignore.",
        ),
        Setting(
            "dlx_exchange",
            DEFAULT_DLX_EXCHANGE,
            _str,
            "Name of the dead-letter exchange every DLX queue routes to (unset: celery_dlx, or "
            "celery_dlx.PREFIX when dlx_key_prefix is not the default, so apps with prefixes of "
            "their own on one virtual host keep their dead letters apart).",
        ),
        Setting(
            "dlx_service_queue",
            DEFAULT_SERVICE_QUEUE,
            _str,
            "Queue the DLX service consumes dead letters from (unset: celery_dlx.dead, or "
            "celery_dlx.PREFIX.dead when dlx_key_prefix is not the default).",
        ),
        Setting(
            "dlx_quorum",
            False,
            _bool,
            "Declare the app's queues as quorum queues with at-least-once dead-lettering.",
        ),
        Setting(
            "dlx_delivery_limit",
            None,
            _optional_count,
            "x-delivery-limit of quorum queues (None: unlimited, celery_dlx counts attempts itself).",
        ),
        Setting(
            "dlx_queues",
            {},
            _queue_policies,
            "Per-queue policies, also for foreign queues: {queue: {backoff, max_requeues, max_parks, importance, expired, breaker}}.",
        ),
        Setting(
            "dlx_breaker",
            None,
            _breaker,
            "Per-cause breaker (automatic hold), off when None: "
            '{"failures": 50, "window": 60, "hold": 300, "probe": 60, "release_rate": 50} holds '
            "new failures of a cause that failed more than failures times in window seconds on a "
            "queue, without spending their budget, and releases one canary every probe seconds "
            f"({doc_url('monitoring')}).",
        ),
        Setting(
            "dlx_expired",
            "park",
            _choice(EXPIRED_ACTIONS),
            "What the DLX service does with a message that died of TTL expiry: park (return it later) or bury.",
        ),
        Setting(
            "dlx_service_in_worker",
            False,
            _bool,
            "Run the DLX service inside every worker of the app (a bootstep).",
        ),
        Setting(
            "dlx_service_prefetch",
            1000,
            _positive_count,
            "Prefetch of the DLX service consumer (a batch is up to a third of it).",
        ),
        Setting(
            "dlx_obituary_task",
            None,
            _optional_str,
            "Name of a task sent every obituary (as JSON-safe data) when a message is buried.",
        ),
        Setting(
            "dlx_code_version",
            None,
            _optional_str,
            "Code version written into obituaries (default: $DLX_CODE_VERSION, $GIT_COMMIT or unset).",
        ),
        Setting(
            "dlx_graveyard_retention",
            30 * 86400.0,
            _seconds,
            "Seconds an obituary stays in the graveyard before it moves to the failure history only.",
        ),
        Setting(
            "dlx_graveyard_max_per_cause",
            10000,
            _count,
            "Most obituaries one cause keeps in the graveyard (per shard with dlx_redis_shards); "
            "0: no cap. As Sidekiq's dead_max_jobs (10,000), so one storm cannot take the whole "
            "graveyard budget from every other cause; unlike it nothing is dropped: past the cap "
            "the DLX service moves the cause's dead letters, whole, to the queue "
            "<dlx_service_queue>.overflow in RabbitMQ, and `dlx overflow --requeue` hands them "
            "back to the service once the cause has room (after a purge or a replay).",
        ),
        Setting(
            "dlx_resolve_after",
            3600.0,
            _seconds,
            "Seconds after a replay with no new burial of the replayed message before its "
            "obituary counts as resolved (a DLX task's success resolves it at once; a foreign "
            "consumer's replay only this way). Longer than the replayed message's retries take "
            "(the default ladder's take about 5 minutes): a failure after it still marks the "
            "obituary failed-again.",
        ),
        Setting(
            "dlx_resolved_retention",
            86400.0,
            _seconds,
            "Seconds a resolved obituary stays in the graveyard (list --status resolved) before "
            "it moves to the failure history only.",
        ),
        Setting(
            "dlx_graveyard_max_bytes",
            0,
            _count,
            "Bytes the graveyard may hold (obituary records and payloads, plus a fixed 900 B each "
            "for their indexes); 0 (the default): half of Redis' maxmemory, or no limit when "
            "Redis has none. Past it, and whenever Redis uses more than 90% of maxmemory, the "
            "DLX service buries nothing and dead letters wait in its queue, so parked retries "
            "keep their room; `dlx check` fails and /metrics says so until `dlx purge` or the "
            "retention makes room.",
        ),
        Setting(
            "dlx_cause_ttl",
            7 * 86400.0,
            _seconds,
            "Seconds a worker-side cause record waits for the DLX service.",
        ),
        Setting(
            "dlx_delay_backend",
            "redis",
            _choice(DELAY_BACKENDS),
            "Where parked retries wait: redis (sorted set) or ttl (broker-only delay-queue ladder).",
        ),
        Setting(
            "dlx_parent_parks",
            True,
            _bool,
            "A worker's main process writes its pool's parks to Redis in batches, and publishes its requeued copies with pipelined confirms, and acks each original after its copy is in (redis delay backend; prefork and threads pools); False, and on other pools: each run parks or requeues before it ends.",
        ),
        Setting(
            "dlx_ttl_ladder",
            [1, 5, 10, 30, 60, 300, 900, 3600],
            _ladder,
            "Delays (seconds) of the TTL delay queues; other delays round up to the next step.",
        ),
        Setting(
            "dlx_protobuf_descriptor_sets",
            [],
            _str_list,
            "Paths of protobuf descriptor sets used to decode payloads for inspection.",
        ),
        Setting(
            "dlx_protobuf_modules",
            [],
            _str_list,
            "Python modules with generated protobuf classes used to decode payloads.",
        ),
        Setting(
            "dlx_send_events",
            True,
            _bool,
            "Send task-requeued/parked/buried/replayed events (Flower shows them).",
        ),
        Setting(
            "dlx_events_follow_worker",
            True,
            _bool,
            "In a worker, send those events only while it sends task events (-E, worker_send_task_events, or celery control enable_events, as Flower does), as Celery does for its own; False: always. The DLX service and the CLI always send them.",
        ),
        Setting(
            "dlx_sentry",
            True,
            _bool,
            "Report burials to Sentry when sentry_sdk is initialised (set explicitly, sentry-sdk must be installed).",
        ),
        Setting(
            "dlx_sentry_include_payload",
            False,
            _bool,
            "Attach the (size-capped, decoded) payload to Sentry events.",
        ),
        Setting(
            "dlx_sentry_payload_limit",
            4096,
            _positive_count,
            "Bytes of payload attached to a Sentry event at most.",
        ),
        Setting(
            "dlx_sentry_rate_limit",
            10,
            _positive_count,
            "Sentry events per cause fingerprint per window at most.",
        ),
        Setting(
            "dlx_sentry_rate_window",
            3600.0,
            _seconds,
            "Seconds of the per-cause Sentry rate-limit window.",
        ),
        Setting(
            "dlx_web_host",
            "127.0.0.1",
            _str,
            "Address `celery dlx web` listens on (a non-loopback address needs credentials).",
        ),
        Setting("dlx_web_port", 5566, _positive_count, "Port of `celery dlx web`."),
        Setting(
            "dlx_web_allowed_hosts",
            [],
            _host_patterns,
            "Host names the console answers besides the address it listens on (a proxy's or "
            "tunnel's name; `*.corp.example` for any name under a domain); any other Host gets 400.",
        ),
        Setting(
            "dlx_web_basic_auth",
            [],
            _str_list,
            "Console operators (read, replay, purge) as USER:PASSWORD strings (HTTP Basic).",
        ),
        Setting(
            "dlx_web_viewer_auth",
            [],
            _str_list,
            "Console viewers (read only) as USER:PASSWORD strings (HTTP Basic).",
        ),
        Setting(
            "dlx_web_editors",
            [],
            _str_list,
            "Console editors (what operators may, and edit a buried message's payload and "
            "headers before replaying it) as USER:PASSWORD strings (HTTP Basic).",
        ),
        Setting(
            "dlx_web_max_replay_rate",
            50,
            _positive_count,
            "Most replays per second one console replay may ask for (the form's rate is capped to it).",
        ),
    )
}


#: Settings that turn Sentry reporting on or tune it: set explicitly, sentry-sdk is required.
SENTRY_SETTINGS = frozenset(name for name in SETTINGS if name.startswith("dlx_sentry"))


def sentry_missing(explicit: Iterable[str], why: str) -> str:
    """The error for Sentry settings set while sentry-sdk cannot be imported."""
    named = ", ".join(sorted(set(explicit) & SENTRY_SETTINGS))
    return (
        f"{named} set but sentry-sdk cannot be imported ({why}): "
        "`pip install celery-dlx[sentry]`, or set dlx_sentry = False"
    )
