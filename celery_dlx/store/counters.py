"""The per-minute fate counters: their one format, written and read here.

Every recorded fate change increments one Redis hash per epoch minute, ``keys.counter(minute)``
(``{prefix}:count:<minute>``), field ``<queue>|<fate>`` (:func:`field_name`); each hash expires
after :data:`COUNTER_TTL` seconds. :func:`add_counts` writes them in the pipeline that appends
the history; the rest reads them back (windows, thresholds, Prometheus text).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from celery_dlx.errors import ConfigurationError
from celery_dlx.fates import FATE_CHANGES, FateEvent, now_ms
from celery_dlx.message.counts import Count, Counts
from celery_dlx.message.names import Keys
from celery_dlx.store.client import RedisClient, text

if TYPE_CHECKING:
    from redis.client import Pipeline
    from redis.cluster import ClusterPipeline

#: The field separator between queue and fate.
SEPARATOR = "|"
#: Seconds a per-minute counter is kept.
COUNTER_TTL = 8 * 86400
#: Most minutes one read may cover (the counters' own retention).
MAX_MINUTES = COUNTER_TTL // 60


def field_name(queue: str, fate: str) -> str:
    return f"{queue}{SEPARATOR}{fate}"


def add_counts(pipe: Pipeline | ClusterPipeline, keys: Keys, events: Iterable[FateEvent]) -> None:
    """Queue in ``pipe`` the increments of ``events``; the caller executes it."""
    counts: Counter[tuple[str, str]] = Counter()
    for event in events:
        counts[(keys.counter(minute_of(event.at_ms)), field_name(event.queue, event.fate))] += 1
    for (key, name), n in counts.items():
        pipe.hincrby(key, name, n)
    for key in {key for key, _ in counts}:
        pipe.expire(key, COUNTER_TTL)


def parse_field(name: str) -> tuple[str, str]:
    """Split a counter field into ``(queue, fate)``, on the last separator (a queue name may
    hold one).

    Raises:
        ValueError: the field has no separator or an empty part.
    """
    queue, sep, fate = name.rpartition(SEPARATOR)
    if not sep or not queue or not fate:
        raise ValueError(f"counter field {name!r} is not '<queue>{SEPARATOR}<fate>'")
    return queue, fate


def minute_of(ms: int) -> int:
    return ms // 60000


def read_minutes(client: RedisClient, keys: Keys, start_minute: int, end_minute: int) -> Counts:
    """Every counter from ``start_minute`` to ``end_minute`` (epoch minutes, both included).

    Raises:
        ConfigurationError: the range is reversed or longer than :data:`MAX_MINUTES`.
    """
    if end_minute < start_minute:
        raise ConfigurationError(
            f"counter window ends ({end_minute}) before it starts ({start_minute})"
        )
    if end_minute - start_minute + 1 > MAX_MINUTES:
        raise ConfigurationError(
            f"counter window of {end_minute - start_minute + 1} minutes exceeds the counters' "
            f"retention ({MAX_MINUTES} minutes); ask for a shorter window"
        )
    minutes = list(range(start_minute, end_minute + 1))
    pipe = client.pipeline(transaction=False)
    for minute in minutes:
        pipe.hgetall(keys.counter(minute))
    result = Counts(start_minute=start_minute, end_minute=end_minute)
    for minute, fields in zip(minutes, pipe.execute(), strict=True):
        key = keys.counter(minute)
        for raw_name, raw_value in sorted((fields or {}).items()):
            name, value = text(raw_name), text(raw_value)
            try:
                queue, fate = parse_field(name)
                count = int(value)
            except ValueError as exc:
                result.malformed.append((key, name, str(exc)))
                continue
            result.rows.append(Count(minute=minute, queue=queue, fate=fate, count=count))
    return result


def read_window(
    client: RedisClient, keys: Keys, seconds: float, *, at_ms: int | None = None
) -> Counts:
    """The counters of the last ``seconds`` up to ``at_ms`` (default now), in whole minutes
    (the current, partial one included: 60 seconds read two).

    Raises:
        ConfigurationError: ``seconds`` is not positive or exceeds the counters' retention.
    """
    if seconds <= 0:
        raise ConfigurationError(
            f"counter window must be a positive number of seconds, got {seconds}"
        )
    end = minute_of(now_ms() if at_ms is None else at_ms)
    span = max(1, int(-(-seconds // 60)))
    return read_minutes(client, keys, end - span, end)


@dataclass(frozen=True)
class Threshold:
    """An alert condition: more than ``limit`` messages met ``fate`` within ``seconds``.

    Args:
        fate: one of :data:`celery_dlx.fates.FATE_CHANGES`.
        limit: the count that may be reached without alerting.
        seconds: the window the count is taken over.
        queue: one queue, or None for each queue separately.
    """

    fate: str
    limit: int
    seconds: float = 300.0
    queue: str | None = None

    def __post_init__(self) -> None:
        if self.fate not in FATE_CHANGES:
            raise ConfigurationError(
                f"threshold fate must be one of {', '.join(FATE_CHANGES)}; got {self.fate!r}"
            )
        if self.limit < 0:
            raise ConfigurationError(f"threshold limit must be >= 0, got {self.limit}")
        if self.seconds <= 0:
            raise ConfigurationError(f"threshold window must be > 0 seconds, got {self.seconds}")


@dataclass(frozen=True)
class Breach:
    """A threshold exceeded by one queue."""

    threshold: Threshold
    queue: str
    count: int


def breaches(
    client: RedisClient, keys: Keys, thresholds: Iterable[Threshold], *, at_ms: int | None = None
) -> list[Breach]:
    """Each ``(threshold, queue)`` whose count over the threshold's window exceeds its limit."""
    found: list[Breach] = []
    at = now_ms() if at_ms is None else at_ms
    windows: dict[float, Counts] = {}
    for threshold in thresholds:
        if threshold.seconds not in windows:
            windows[threshold.seconds] = read_window(client, keys, threshold.seconds, at_ms=at)
        totals = windows[threshold.seconds].totals()
        for (queue, fate), count in sorted(totals.items()):
            if fate != threshold.fate or (threshold.queue is not None and queue != threshold.queue):
                continue
            if count > threshold.limit:
                found.append(Breach(threshold=threshold, queue=queue, count=count))
    return found


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus_text(totals: Mapping[tuple[str, str], int], seconds: float) -> str:
    """Totals in Prometheus text format (a gauge ``celery_dlx_fate_changes{queue, fate,
    window}``), for a node-exporter textfile collector."""
    lines = [
        "# HELP celery_dlx_fate_changes Messages per queue and fate within the window.",
        "# TYPE celery_dlx_fate_changes gauge",
    ]
    window = f"{int(seconds)}s"
    for (queue, fate), count in sorted(totals.items()):
        lines.append(
            f'celery_dlx_fate_changes{{queue="{_label(queue)}",fate="{_label(fate)}",'
            f'window="{window}"}} {count}'
        )
    return "\n".join(lines) + "\n"
