"""Open per-cause breakers on the console: a read-only table on the overview, gauges on
``/metrics`` (real uvicorn server, real Redis)."""

from __future__ import annotations

import re
from typing import Any

from celery_dlx.fates import now_ms
from celery_dlx.policy.breaker import BreakerSettings
from tests.web.helpers import XSS


def test_overview_and_metrics_show_open_breakers(console: dict[str, Any]) -> None:
    runtime, queue = console["runtime"], console["app"].conf.task_default_queue
    viewer = console["viewer"]
    assert 'id="breakers"' not in viewer.get("/").text
    assert "celery_dlx_breakers_open 0.0" in viewer.get("/metrics").text
    settings = BreakerSettings(failures=1, hold=60, probe=10)
    now = now_ms()
    for i in range(4):
        runtime.breakers.fail(queue, "cafe01", settings, now, entry_id=f"m{i}:0", task=XSS)
    page = viewer.get("/")
    rows = re.findall(r'<tr class="breaker">(.*?)</tr>', page.text, re.S)
    assert len(rows) == 1
    assert "cafe01" in rows[0] and '<td class="num">3</td>' in rows[0]
    assert "<script>window" not in rows[0] and "&lt;script&gt;window" in rows[0]
    metrics = viewer.get("/metrics").text
    assert "celery_dlx_breakers_open 1.0" in metrics
    assert f'celery_dlx_breaker_held{{cause="cafe01",queue="{queue}"}} 3.0' in metrics
    runtime.breakers.close(queue, "cafe01")
    assert 'id="breakers"' not in viewer.get("/").text
