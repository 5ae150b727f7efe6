"""One Sentry message per breaker opening (celery_dlx.integrations.breakers), real sentry-sdk
with a capturing transport (no network, no Redis)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sentry_sdk

from celery_dlx.fates import PARKED, FateEvent
from celery_dlx.integrations.breakers import BreakerAlert, install_breaker_alert
from celery_dlx.policy.config import load_config
from celery_dlx.wiring.runtime import Runtime
from tests.unit.test_sentry_reporter import CapturingTransport


@pytest.fixture
def transport() -> Iterator[CapturingTransport]:
    capture = CapturingTransport()
    sentry_sdk.init(
        dsn="http://public@127.0.0.1:9/1", transport=capture, default_integrations=False
    )
    yield capture
    sentry_sdk.get_client().close()
    sentry_sdk.init()


def runtime(**settings: Any) -> Runtime:
    return Runtime(app=None, config=load_config({"dlx_key_prefix": "unit", **settings}))  # type: ignore[arg-type]


def event(breaker: str | None) -> FateEvent:
    return FateEvent.from_fields(
        fate=PARKED,
        queue="orders",
        message_id="m-1",
        attempt=0,
        task="shop.charge",
        cause="d65395afda5f3d30",
        exc_type="ConnectionError",
        exc_message="gateway unreachable",
        extra={} if breaker is None else {"breaker": breaker},
    )


def test_only_the_opening_is_sent_once_with_cause_and_settings(
    transport: CapturingTransport,
) -> None:
    alert = BreakerAlert(runtime(dlx_breaker={"failures": 5, "hold": 30, "probe": 3}))
    for breaker in (None, "opened", "held", "canary", "held"):
        alert(event(breaker))
    sentry_sdk.flush()
    [sent] = transport.events
    assert sent["level"] == "warning"
    assert sent["fingerprint"] == ["celery_dlx.breaker", "orders", "d65395afda5f3d30"]
    assert sent["tags"]["celery_dlx.cause"] == "d65395afda5f3d30"
    assert sent["tags"]["celery_dlx.task"] == "shop.charge"
    assert "breaker opened" in sent["message"] and "ConnectionError" in sent["message"]
    assert sent["contexts"]["breaker"]["failures"] == 5
    assert sent["contexts"]["breaker"]["hold"] == 30.0


def test_no_listener_when_sentry_is_off_or_no_breaker_is_set() -> None:
    on = {"failures": 5}
    assert install_breaker_alert(runtime(dlx_sentry=False, dlx_breaker=on)) is None
    assert install_breaker_alert(runtime()) is None
    assert isinstance(install_breaker_alert(runtime(dlx_breaker=on)), BreakerAlert)
    queue_only = runtime(dlx_queues={"orders": {"breaker": on}})
    assert isinstance(install_breaker_alert(queue_only), BreakerAlert)
