"""Celery's echo of a run celery_dlx handled (ignored / rejected) leaves the logs; others stay."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery
from celery._state import _task_stack
from celery.exceptions import Reject

import celery_dlx
from celery_dlx.fates import BURIED, PARKED, REQUEUED, FateEvent
from celery_dlx.integrations.logs import TRACE_LOGGER, CeleryEchoFilter, install_log_filter


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)  # like Celery's worker handler: no level of its own
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def trace() -> Iterator[tuple[logging.Logger, Capture]]:
    logger = logging.getLogger(TRACE_LOGGER)
    capture = Capture()
    level, filters = logger.level, list(logger.filters)
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)
    yield logger, capture
    logger.removeHandler(capture)
    logger.setLevel(level)
    logger.filters[:] = filters


@pytest.fixture
def app() -> Any:
    app = Celery("unit-logs", set_as_current=False)
    celery_dlx.install(app)
    app.conf.update(dlx_enabled=True, dlx_key_prefix="unit")

    @app.task(name="dlx.charge", shared=False)
    def charge() -> None:
        return None

    plain = Celery("unit-logs-plain", set_as_current=False)

    @plain.task(name="plain.charge", shared=False)
    def plain_charge() -> None:
        return None

    app.plain = plain
    return app


def _log_like_celery(logger: logging.Logger, level: int, description: str, name: str,
                     task_id: str, exc: BaseException | None) -> None:  # fmt: skip
    context = {"id": task_id, "name": name, "description": description, "exc": repr(exc)}
    exc_info = None
    if exc is not None:
        try:
            raise exc
        except BaseException as raised:
            exc_info = (type(raised), raised, raised.__traceback__)
    logger.log(level, "Task %(name)s[%(id)s] %(description)s", context, exc_info=exc_info,
               extra={"data": context})  # fmt: skip


def _event(fate: str, message_id: str) -> FateEvent:
    return FateEvent.from_fields(
        fate=fate, queue="q", message_id=message_id, attempt=1, task="dlx.charge"
    )


def test_ignored_line_of_a_requeue_or_park_recorded_here_is_dropped(
    app: Any, trace: tuple[logging.Logger, Capture]
) -> None:
    logger, capture = trace
    echo = install_log_filter(app)
    echo(_event(REQUEUED, "id-r"))
    echo(_event(PARKED, "id-p"))
    echo(_event(BURIED, "id-b"))  # not a run that ends in Ignore here
    for task_id in ("id-r", "id-p", "id-b", "id-user"):
        _log_like_celery(logger, logging.INFO, "ignored", "dlx.charge", task_id, None)
    _log_like_celery(logger, logging.INFO, "ignored", "dlx.charge", "id-r", None)  # 2nd run
    kept = [r.args["id"] for r in capture.records]  # type: ignore[call-overload,index]
    assert kept == ["id-b", "id-user", "id-r"]


def test_nothing_is_remembered_while_celery_would_not_log_the_ignored_line(
    app: Any, trace: tuple[logging.Logger, Capture]
) -> None:
    logger, capture = trace
    echo = install_log_filter(app)
    logger.setLevel(logging.WARNING)  # Celery's default worker level: no `ignored` lines
    for n in range(10):
        echo(_event(PARKED, f"id-{n}"))
    assert not echo._handled
    logger.setLevel(logging.INFO)
    echo(_event(PARKED, "id-p"))
    _log_like_celery(logger, logging.INFO, "ignored", "dlx.charge", "id-p", None)
    assert capture.records == []  # lowered as before once the line is logged
    assert not echo._handled


@contextmanager
def running(task: Any, task_id: str) -> Iterator[None]:
    """Make ``task`` the worker's current task with request id ``task_id``, as trace does."""
    task.push_request(id=task_id, called_directly=False)
    _task_stack.push(task)
    try:
        yield
    finally:
        _task_stack.pop()
        task.pop_request()


def test_dlx_burial_reject_is_dropped_other_rejects_stay(
    app: Any, trace: tuple[logging.Logger, Capture]
) -> None:
    logger, capture = trace
    install_log_filter(app)
    dlx_task, plain_task = app.tasks["dlx.charge"], app.plain.tasks["plain.charge"]
    bury = Reject(ValueError("bad"), requeue=False)
    with running(dlx_task, "a"):
        _log_like_celery(logger, logging.WARNING, "rejected", "dlx.charge", "a", bury)
    with running(dlx_task, "b"):
        _log_like_celery(logger, logging.WARNING, "rejected", "dlx.charge", "b",
                         Reject(ValueError("again"), requeue=True))  # fmt: skip
    with running(plain_task, "c"):
        _log_like_celery(logger, logging.WARNING, "rejected", "plain.charge", "c", bury)
    with running(dlx_task, "other-id"):
        _log_like_celery(logger, logging.WARNING, "rejected", "dlx.charge", "d", bury)
    _log_like_celery(logger, logging.WARNING, "rejected", "dlx.charge", "e", bury)  # no run
    kept = [r.args["id"] for r in capture.records]  # type: ignore[call-overload,index]
    assert kept == ["b", "c", "d", "e"]
    assert all(r.levelno == logging.WARNING and r.exc_info for r in capture.records)


def test_at_debug_the_echo_is_kept_as_one_debug_line(
    app: Any, trace: tuple[logging.Logger, Capture]
) -> None:
    logger, capture = trace
    logger.setLevel(logging.DEBUG)
    install_log_filter(app)
    with running(app.tasks["dlx.charge"], "a"):
        _log_like_celery(logger, logging.WARNING, "rejected", "dlx.charge", "a",
                         Reject(ValueError("bad"), requeue=False))  # fmt: skip
    (record,) = capture.records
    assert record.levelno == logging.DEBUG and record.levelname == "DEBUG"
    assert record.exc_info is None


def test_odd_records_pass_untouched(app: Any, trace: tuple[logging.Logger, Capture]) -> None:
    logger, capture = trace
    install_log_filter(app)
    logger.info("no data at all")
    logger.info("odd data", extra={"data": ["not", "a", "dict"]})
    _log_like_celery(logger, logging.ERROR, "raised unexpected", "dlx.charge", "x", ValueError("x"))
    assert [r.levelno for r in capture.records] == [logging.INFO, logging.INFO, logging.ERROR]


def test_one_filter_per_app(app: Any, trace: tuple[logging.Logger, Capture]) -> None:
    logger, _ = trace
    first = install_log_filter(app)
    assert install_log_filter(app) is first
    other = Celery("unit-logs-other", set_as_current=False)
    assert install_log_filter(other) is not first
    mine = [f for f in logger.filters if isinstance(f, CeleryEchoFilter) and f.app in (app, other)]
    assert len(mine) == 2


def test_filters_of_collected_apps_are_removed(trace: tuple[logging.Logger, Capture]) -> None:
    import gc

    logger, _ = trace
    gone = Celery("unit-logs-gone", set_as_current=False)
    install_log_filter(gone)
    del gone
    gc.collect()
    kept = Celery("unit-logs-kept", set_as_current=False)
    install_log_filter(kept)
    apps = [f.app for f in logger.filters if isinstance(f, CeleryEchoFilter)]
    assert None not in apps
    assert apps.count(kept) == 1
