"""``/metrics``: a Prometheus collector reading Redis when scraped (no state in the console).

=======================================  ==========================================================
metric                                   labels, meaning
=======================================  ==========================================================
``celery_dlx_graveyard_obituaries``      ``queue``: obituaries in the graveyard
``celery_dlx_graveyard_cause_obituaries`` ``cause``, ``queue``, ``exc_type``: obituaries per cause
``celery_dlx_cause_first_seen_timestamp_seconds``  ``cause``, ``queue``, ``version``: when the cause was first
                                         seen (since its group was last empty) and the code version
                                         it was first seen with ("" unknown)
``celery_dlx_graveyard_total``           obituaries in the graveyard
``celery_dlx_parked``                    ``queue``: parked retries (see ``parked_sampled``)
``celery_dlx_parked_due``                ``queue``: parked retries due now (waiting for a drain)
``celery_dlx_parked_lateness_seconds``   ``queue``: how late the oldest due retry is
``celery_dlx_parked_total``              parked retries (exact)
``celery_dlx_parked_due_total``          parked retries due now (exact)
``celery_dlx_parked_sampled``            parked retries read for the per-queue numbers
``celery_dlx_fate_changes``              ``queue``, ``fate``, ``window`` (5m, 1h): fate changes
                                         within the window, from the per-minute counters
``celery_dlx_redis_used_memory_bytes``   Redis ``used_memory`` (the fullest master of a cluster)
``celery_dlx_redis_maxmemory_bytes``     Redis ``maxmemory`` (0: none set)
``celery_dlx_redis_full``                1 when Redis is within 95% of ``maxmemory`` (writes refused)
``celery_dlx_redis_refused_writes``      commands Redis refused for memory since it started (OOM)
``celery_dlx_graveyard_budget_bytes``    ``dlx_graveyard_max_bytes``, or half of ``maxmemory``
                                         (absent: unlimited)
``celery_dlx_graveyard_bytes``           bytes the graveyard holds, as its budget counts them
``celery_dlx_refused_copies``            ``fate``: parks and requeues workers could not write,
                                         written by the DLX service
``celery_dlx_service_queue_messages``    dead letters ready in the DLX service queue (absent when
                                         the broker cannot be read)
``celery_dlx_service_queue_consumers``   consumers of the DLX service queue
``celery_dlx_scrape_error``              1 when Redis could not be read (the rest is then absent)
=======================================  ==========================================================
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Literal

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from celery_dlx import Runtime
from celery_dlx.ops.checks import FULL_SHARE, redis_memory, refused_copies, service_queue_counts
from celery_dlx.web.reads import parked_summary, yard_of

logger = logging.getLogger(__name__)

#: Cause groups exported at most (the most recently seen), to bound label cardinality.
MAX_CAUSES = 500
#: Fate-counter windows exported.
WINDOWS = (("5m", 300.0), ("1h", 3600.0))


class DLXCollector(Collector):
    """Reads the graveyard, the parking store and the fate counters at scrape time."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[GaugeMetricFamily]:
        error = GaugeMetricFamily(
            "celery_dlx_scrape_error", "1 when celery_dlx could not read Redis for this scrape"
        )
        try:
            families = list(self._families())
        except Exception as exc:  # a scrape reports the failure rather than a 500
            logger.warning("celery_dlx metrics scrape failed: %s", exc)
            error.add_metric([], 1)
            yield error
            return
        error.add_metric([], 0)
        yield error
        yield from families

    def _families(self) -> Iterator[GaugeMetricFamily]:
        yield from self._memory()
        yield from self._service_queue()
        yield from self._store()

    def _memory(self) -> Iterator[GaugeMetricFamily]:
        """Redis memory against maxmemory and the graveyard budget; refused writes and copies
        (what ``celery dlx check`` reports; no write here, a scrape only reads)."""
        runtime = self.runtime
        memory = redis_memory(runtime)
        budget = runtime.graveyard_limit()
        full = memory.share is not None and memory.share >= FULL_SHARE
        for name, text, value in (
            ("celery_dlx_redis_used_memory_bytes", "Redis used_memory", memory.used),
            ("celery_dlx_redis_maxmemory_bytes", "Redis maxmemory (0: none)", memory.maxmemory),
            ("celery_dlx_redis_full", "1 when Redis is within 95% of maxmemory", int(full)),
            (
                "celery_dlx_redis_refused_writes",
                "Commands Redis refused for memory (OOM) since it started",
                memory.refused_writes,
            ),
        ):
            gauge = GaugeMetricFamily(name, text)
            gauge.add_metric([], value)
            yield gauge
        if budget is not None:
            gauge = GaugeMetricFamily(
                "celery_dlx_graveyard_budget_bytes", "Bytes of Redis the graveyard may use"
            )
            gauge.add_metric([], budget)
            yield gauge
        used = GaugeMetricFamily(
            "celery_dlx_graveyard_bytes", "Bytes the graveyard holds, as its budget counts them"
        )
        used.add_metric([], runtime.graveyard.used_bytes())
        yield used
        refused = GaugeMetricFamily(
            "celery_dlx_refused_copies",
            "Parks and requeues workers could not write, written by the DLX service",
            labels=["fate"],
        )
        for fate, n in sorted(refused_copies(runtime).items()):
            refused.add_metric([fate], n)
        yield refused

    def _service_queue(self) -> Iterator[GaugeMetricFamily]:
        """The DLX service queue's ready messages and consumers (absent when the broker cannot
        be read: the Redis metrics still are)."""
        queue = self.runtime.config.service_queue
        try:
            counts = service_queue_counts(self.runtime)
        except Exception as exc:
            logger.debug("celery_dlx metrics: could not read %s: %s", queue, exc)
            return
        if counts is None:
            return
        for name, text, value in (
            ("celery_dlx_service_queue_messages", "Dead letters ready in the DLX service queue", 0),
            ("celery_dlx_service_queue_consumers", "Consumers of the DLX service queue", 1),
        ):
            gauge = GaugeMetricFamily(name, text)
            gauge.add_metric([], counts[value])
            yield gauge

    def _store(self) -> Iterator[GaugeMetricFamily]:
        runtime = self.runtime
        yard = yard_of(runtime)
        per_queue = GaugeMetricFamily(
            "celery_dlx_graveyard_obituaries", "Obituaries in the graveyard", labels=["queue"]
        )
        for queue, n, _ in yard.names("queue"):
            per_queue.add_metric([queue], n)
        yield per_queue
        total = GaugeMetricFamily("celery_dlx_graveyard_total", "Obituaries in the graveyard")
        total.add_metric([], yard.count())
        yield total
        causes = [
            c.decode() if isinstance(c, bytes) else str(c) for c in yard.top_causes(MAX_CAUSES)
        ]
        per_cause = GaugeMetricFamily(
            "celery_dlx_graveyard_cause_obituaries",
            "Obituaries in the graveyard per cause fingerprint",
            labels=["cause", "queue", "exc_type"],
        )
        first_seen = GaugeMetricFamily(
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
        gauges: dict[Literal["count", "due_now", "lateness_s"], GaugeMetricFamily] = {
            "count": GaugeMetricFamily(
                "celery_dlx_parked", "Parked retries per queue", labels=["queue"]
            ),
            "due_now": GaugeMetricFamily(
                "celery_dlx_parked_due", "Parked retries due now per queue", labels=["queue"]
            ),
            "lateness_s": GaugeMetricFamily(
                "celery_dlx_parked_lateness_seconds",
                "Seconds the oldest due parked retry of the queue is late",
                labels=["queue"],
            ),
        }
        for row in parked["queues"]:
            for field, gauge in gauges.items():
                gauge.add_metric([row["queue"]], row[field] or 0)
        yield from gauges.values()
        totals: tuple[tuple[str, Literal["count", "due_now", "sampled"], str], ...] = (
            ("celery_dlx_parked_total", "count", "Parked retries"),
            ("celery_dlx_parked_due_total", "due_now", "Parked retries due now"),
            ("celery_dlx_parked_sampled", "sampled", "Parked retries read for per-queue numbers"),
        )
        for name, key, text in totals:
            gauge = GaugeMetricFamily(name, text)
            gauge.add_metric([], parked[key])
            yield gauge
        fates = GaugeMetricFamily(
            "celery_dlx_fate_changes",
            "Messages per queue and fate within the window (per-minute counters)",
            labels=["queue", "fate", "window"],
        )
        for window, seconds in WINDOWS:
            counts = runtime.history.counts(seconds)
            for (queue, fate), n in sorted(counts.totals().items()):
                fates.add_metric([queue, fate, window], n)
        yield fates
