"""``/metrics``: Prometheus collectors reading Redis when scraped (no state in the console).

The metrics and their labels are listed in ``docs/monitoring.md`` and ``docs/operations.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily as Gauge
from prometheus_client.registry import Collector

from celery_dlx import Runtime
from celery_dlx.ops.breakers import open_breakers
from celery_dlx.ops.checks import FULL_SHARE, redis_memory, refused_copies, service_queue_counts
from celery_dlx_console.reads import parked_summary

logger = logging.getLogger(__name__)

#: Cause groups exported at most (the most recently seen), to bound label cardinality.
MAX_CAUSES = 500
#: Fate-counter windows exported.
WINDOWS = (("5m", 300.0), ("1h", 3600.0))


class DLXCollector(Collector):
    """Reads the graveyard, the parking store and the fate counters at scrape time."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Gauge]:
        try:
            families = [*self._memory(), *self._service_queue(), *self._store()]
        except Exception as exc:  # a scrape reports the failure rather than a 500
            logger.warning("celery_dlx metrics scrape failed: %s", exc)
            families = None
        text = "1 when celery_dlx could not read Redis for this scrape"
        yield Gauge("celery_dlx_scrape_error", text, value=int(families is None))
        yield from families or ()

    def _memory(self) -> Iterator[Gauge]:
        """What ``celery dlx check`` reports of Redis memory (a scrape only reads)."""
        runtime = self.runtime
        memory = redis_memory(runtime)
        full = memory.share is not None and memory.share >= FULL_SHARE
        yield Gauge("celery_dlx_redis_used_memory_bytes", "Redis used_memory", value=memory.used)
        yield Gauge(
            "celery_dlx_redis_maxmemory_bytes", "Redis maxmemory (0: none)", value=memory.maxmemory
        )
        yield Gauge(
            "celery_dlx_redis_full", "1 when Redis is within 95% of maxmemory", value=int(full)
        )
        yield Gauge(
            "celery_dlx_redis_refused_writes",
            "Commands Redis refused for memory (OOM) since it started",
            value=memory.refused_writes,
        )
        budget = runtime.graveyard_limit()
        if budget is not None:
            text = "Bytes of Redis the graveyard may use"
            yield Gauge("celery_dlx_graveyard_budget_bytes", text, value=budget)
        text = "Bytes the graveyard holds, as its budget counts them"
        yield Gauge("celery_dlx_graveyard_bytes", text, value=runtime.graveyard.used_bytes())
        refused = Gauge(
            "celery_dlx_refused_copies",
            "Parks and requeues workers could not write, written by the DLX service",
            labels=["fate"],
        )
        for fate, n in sorted(refused_copies(runtime).items()):
            refused.add_metric([fate], n)
        yield refused

    def _service_queue(self) -> Iterator[Gauge]:
        """Absent when the broker cannot be read: the Redis metrics still are."""
        try:
            counts = service_queue_counts(self.runtime)
        except Exception as exc:
            queue = self.runtime.config.service_queue
            logger.debug("celery_dlx metrics: could not read %s: %s", queue, exc)
            return
        if counts is not None:
            text = "Dead letters ready in the DLX service queue"
            yield Gauge("celery_dlx_service_queue_messages", text, value=counts[0])
            text = "Consumers of the DLX service queue"
            yield Gauge("celery_dlx_service_queue_consumers", text, value=counts[1])

    def _store(self) -> Iterator[Gauge]:
        runtime = self.runtime
        yard = runtime.graveyard
        per_queue = Gauge(
            "celery_dlx_graveyard_obituaries", "Obituaries in the graveyard", labels=["queue"]
        )
        for queue, n, _ in yard.names("queue"):
            per_queue.add_metric([queue], n)
        yield per_queue
        yield Gauge("celery_dlx_graveyard_total", "Obituaries in the graveyard", value=yard.count())
        causes = [
            c.decode() if isinstance(c, bytes) else str(c) for c in yard.top_causes(MAX_CAUSES)
        ]
        per_cause = Gauge(
            "celery_dlx_graveyard_cause_obituaries",
            "Obituaries in the graveyard per cause fingerprint",
            labels=["cause", "queue", "exc_type"],
        )
        first_seen = Gauge(
            "celery_dlx_cause_first_seen_timestamp_seconds",
            "When the cause was first seen (Unix time) and the code version it was first seen with",
            labels=["cause", "queue", "version"],
        )
        for group in yard.groups_of(causes):
            per_cause.add_metric([group.cause, group.queue, group.exc_type], group.count)
            if group.first_seen_ms is not None:
                labels = [group.cause, group.queue, group.first_version or ""]
                first_seen.add_metric(labels, group.first_seen_ms / 1000)
        yield per_cause
        yield first_seen
        parked = parked_summary(runtime)
        for name, key, text in (
            ("celery_dlx_parked", "count", "Parked retries per queue"),
            ("celery_dlx_parked_due", "due_now", "Parked retries due now per queue"),
            (
                "celery_dlx_parked_lateness_seconds",
                "lateness_s",
                "Seconds the oldest due parked retry of the queue is late",
            ),
        ):
            gauge = Gauge(name, text, labels=["queue"])
            for row in parked["queues"]:
                gauge.add_metric([row["queue"]], row[key] or 0)  # type: ignore[literal-required]
            yield gauge
        yield Gauge("celery_dlx_parked_total", "Parked retries", value=parked["count"])
        yield Gauge(
            "celery_dlx_parked_due_total", "Parked retries due now", value=parked["due_now"]
        )
        text = "Parked retries read for per-queue numbers"
        yield Gauge("celery_dlx_parked_sampled", text, value=parked["sampled"])
        fates = Gauge(
            "celery_dlx_fate_changes",
            "Messages per queue and fate within the window (per-minute counters)",
            labels=["queue", "fate", "window"],
        )
        for window, seconds in WINDOWS:
            for (queue, fate), n in sorted(runtime.history.counts(seconds).totals().items()):
                fates.add_metric([queue, fate, window], n)
        yield fates


class BreakerCollector(Collector):
    """Reads the open breakers at scrape time; a Redis error leaves these families out (the main
    collector's ``celery_dlx_scrape_error`` reports the outage)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Gauge]:
        try:
            rows = open_breakers(self.runtime)
        except Exception as exc:
            logger.warning("celery_dlx breaker metrics scrape failed: %s", exc)
            return
        yield Gauge("celery_dlx_breakers_open", "Open per-cause breakers", value=len(rows))
        each = Gauge(
            "celery_dlx_breaker_open",
            "1 per open per-cause breaker",
            labels=["queue", "cause", "task", "exc_type"],
        )
        where = ["queue", "cause"]
        held = Gauge(
            "celery_dlx_breaker_held",
            "Messages held by an open breaker since it opened",
            labels=where,
        )
        opened = Gauge(
            "celery_dlx_breaker_opened_timestamp_seconds",
            "When an open breaker opened (Unix time)",
            labels=where,
        )
        for row in rows:
            q, c = str(row["queue"]), str(row["cause"])
            each.add_metric([q, c, str(row["task"]), str(row["exc_type"])], 1)
            held.add_metric([q, c], float(row["held"]))
            opened.add_metric([q, c], float(row["opened_ms"]) / 1000)
        yield from (each, held, opened)
