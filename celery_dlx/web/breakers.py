"""``/metrics`` gauges of the per-cause breakers (``dlx_breaker``), listed in
``docs/monitoring.md``."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily as Gauge
from prometheus_client.registry import Collector

from celery_dlx import Runtime
from celery_dlx.ops.breakers import open_breakers

logger = logging.getLogger(__name__)


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
