"""SentryReporter with the real sentry-sdk and a capturing transport (no network, no Redis)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import sentry_sdk
from sentry_sdk.transport import Transport

from celery_dlx.fates import BURIED, PARKED, REQUEUED, FateEvent
from celery_dlx.integrations import sentry as sentry_mod
from celery_dlx.integrations.sentry import SentryReporter, install_sentry
from celery_dlx.policy.config import load_config
from celery_dlx.wiring.runtime import Runtime


class CapturingTransport(Transport):
    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self.events: list[dict[str, Any]] = []

    def capture_envelope(self, envelope: Any) -> None:
        for item in envelope.items:
            if item.type == "event":
                self.events.append(item.payload.json)


class FakeBudget:
    """Stands in for the Redis window budget (tested against real Redis in integration)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.spent: dict[str, int] = {}

    def spend(self, what: str) -> tuple[bool, int]:
        self.spent[what] = self.spent.get(what, 0) + 1
        return self.spent[what] <= self.limit, self.spent[what]


class QuietRuntime(Runtime):
    """A runtime whose counters are not written (no Redis in unit tests)."""

    def _count(self, events: Any, pipe: Any = None) -> None:
        return None


def _runtime(**settings: Any) -> QuietRuntime:
    return QuietRuntime(app=None, config=load_config({"dlx_key_prefix": "unit", **settings}))


@pytest.fixture
def transport() -> Iterator[CapturingTransport]:
    capture = CapturingTransport()
    sentry_sdk.init(
        dsn="http://public@127.0.0.1:9/1", transport=capture, default_integrations=False
    )
    # sentry-sdk's scopes are the process's: breadcrumbs that other tests of this test process
    # left there would go into this test's events (a foreign celery_dlx crumb made the
    # breadcrumb test fail now and then under xdist). Each test starts with none.
    for scope in (
        sentry_sdk.Scope.get_global_scope(),
        sentry_sdk.Scope.get_isolation_scope(),
        sentry_sdk.Scope.get_current_scope(),
    ):
        scope.clear_breadcrumbs()
    yield capture
    sentry_sdk.get_client().close()
    sentry_sdk.init()


def _reporter(limit: int = 10, **settings: Any) -> tuple[SentryReporter, FakeBudget]:
    reporter = SentryReporter(_runtime(**settings))
    budget = FakeBudget(limit)
    reporter.budget = budget  # type: ignore[assignment]
    return reporter, budget


def _event(
    fate: str = BURIED, cause: str = "cause-a", importance: str = "page", **kw: Any
) -> FateEvent:
    return FateEvent.from_fields(
        fate=fate,
        queue="orders",
        message_id=kw.pop("message_id", "m-1"),
        attempt=kw.pop("attempt", 3),
        task="shop.charge",
        cause=cause,
        exc_type="ValueError",
        exc_message="bad order",
        importance=importance,
        **kw,
    )


def test_burial_is_one_event_with_level_from_importance(transport: CapturingTransport) -> None:
    reporter, _ = _reporter()
    reporter(_event(importance="page"))
    reporter(_event(importance="notify", cause="cause-b"))
    assert [e["level"] for e in transport.events] == ["fatal", "warning"]
    assert [e["fingerprint"] for e in transport.events] == [["cause-a"], ["cause-b"]]
    assert transport.events[0]["tags"]["fate"] == "buried"


def test_ignore_importance_sends_nothing_and_spends_no_budget(
    transport: CapturingTransport,
) -> None:
    reporter, budget = _reporter()
    reporter(_event(importance="ignore"))
    assert transport.events == []
    assert budget.spent == {}


def test_budget_per_cause_bounds_a_storm(transport: CapturingTransport) -> None:
    reporter, _ = _reporter(limit=2)
    for i in range(20):
        reporter(_event(cause="storm", message_id=f"m-{i}"))
    reporter(_event(cause="other"))
    causes = [e["fingerprint"][0] for e in transport.events]
    assert causes == ["storm", "storm", "other"]
    assert transport.events[1]["contexts"]["celery_dlx"]["events_of_cause_in_window"] == 2


def test_requeues_and_parks_are_breadcrumbs_not_events(transport: CapturingTransport) -> None:
    reporter, budget = _reporter()
    with sentry_sdk.isolation_scope():
        reporter(_event(fate=REQUEUED, attempt=1))
        reporter(_event(fate=PARKED, attempt=2, delay=5.0))
        assert transport.events == []
        assert budget.spent == {}
        sentry_sdk.capture_message("unrelated error in the same task")
    (event,) = transport.events
    crumbs = [c for c in event["breadcrumbs"]["values"] if c.get("category") == "celery_dlx"]
    assert [c["data"]["fate"] for c in crumbs] == ["requeued", "parked"]
    assert crumbs[1]["data"]["delay"] == 5.0


def test_burial_breadcrumbs_are_the_message_history_only(transport: CapturingTransport) -> None:
    reporter, _ = _reporter()
    sentry_sdk.add_breadcrumb(message="unrelated, from this process")
    history = [[1000, REQUEUED, "cause-a"], [2000, PARKED, "cause-a"], [3000, BURIED, "cause-a"]]
    reporter(_event(extra={"history": history}))
    (event,) = transport.events
    crumbs = event["breadcrumbs"]["values"]
    assert [c["data"]["fate"] for c in crumbs] == ["requeued", "parked", "buried"]


def test_payload_only_when_asked_and_capped(transport: CapturingTransport) -> None:
    body = b'{"order": "' + b"x" * 10_000 + b'"}'
    extra = {"payload": body, "content_type": "application/json", "content_encoding": "utf-8"}
    plain, _ = _reporter()
    plain(_event(extra=extra))
    assert "extra" not in transport.events[0] or "payload" not in transport.events[0]["extra"]
    with_payload, _ = _reporter(dlx_sentry_include_payload=True, dlx_sentry_payload_limit=256)
    with_payload(_event(cause="cause-p", extra=extra))
    sent = transport.events[1]["extra"]
    assert len(sent["payload"].encode()) <= 256
    assert sent["payload_truncated"] is True
    assert sent["payload_bytes"] == len(body)


def test_nothing_without_an_active_client() -> None:
    sentry_sdk.init()  # no DSN: inactive client
    reporter, budget = _reporter()
    reporter(_event())
    assert budget.spent == {}


def test_disabled_setting_installs_nothing() -> None:
    assert install_sentry(_runtime(dlx_sentry=False)) is None
    assert isinstance(install_sentry(_runtime()), SentryReporter)


def test_burial_log_line_is_not_a_second_event() -> None:
    """Sentry's logging integration would turn Runtime.record's ERROR line into an event."""
    from sentry_sdk.integrations import logging as sentry_logging
    from sentry_sdk.integrations.logging import LoggingIntegration

    # unignore_logger is new in sentry-sdk 2.x (2.0 has none); without it, a logger once ignored in this process (by
    # another test's install_sentry) stays so, and the line would be no event without the hooks
    # either: only the part with the hooks can be checked there.
    unignore_logger = getattr(sentry_logging, "unignore_logger", None)

    def burials(hooks: bool) -> list[dict[str, Any]]:
        capture = CapturingTransport()
        sentry_sdk.init(
            dsn="http://public@127.0.0.1:9/1",
            transport=capture,
            default_integrations=False,
            integrations=[LoggingIntegration(level=logging.INFO, event_level=logging.ERROR)],
        )
        runtime = _runtime()
        if unignore_logger is not None:
            unignore_logger(sentry_mod.FATE_LOGGER)
        if hooks:
            reporter = install_sentry(runtime)
            assert reporter is not None
            reporter.budget = FakeBudget(10)  # type: ignore[assignment]
            runtime.listeners.append(reporter)
        runtime.record(_event(traceback="Traceback ...\nValueError: bad order"), history=False)
        sentry_sdk.get_client().close()
        return capture.events

    try:
        if unignore_logger is not None:
            without = burials(hooks=False)
            assert len(without) == 1 and without[0]["logger"] == "celery_dlx"  # the log line
        with_hooks = burials(hooks=True)
        assert len(with_hooks) == 1
        assert with_hooks[0]["fingerprint"] == ["cause-a"]  # ours, not the log line
    finally:
        sentry_sdk.init()


def test_listeners_survive_when_get_runtime_is_what_configures_the_app() -> None:
    """install(app)'s configure hook runs inside the first app.conf read: one runtime results."""
    from celery import Celery

    import celery_dlx
    from celery_dlx.integrations import CeleryEchoFilter, EventSender
    from celery_dlx.wiring.runtime import get_runtime

    app = Celery("unit-first-touch", set_as_current=False)
    celery_dlx.install(app)
    app.conf.update(dlx_enabled=True, dlx_key_prefix="unit")
    runtime = get_runtime(app)  # the first read of app.conf
    assert runtime is get_runtime(app)
    assert {type(x) for x in runtime.listeners} == {CeleryEchoFilter, SentryReporter, EventSender}
