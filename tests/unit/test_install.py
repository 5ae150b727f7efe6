"""``install(app)`` and ``dlx_enabled`` on real Celery app objects, without a broker connection."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from kombu import Exchange, Queue

import celery_dlx
from celery_dlx.broker.topology import DLXQueue, dead_letter_arguments
from celery_dlx.errors import ConfigurationError
from celery_dlx.install import DEFAULT_CONSUMER, DLX_CONSUMER
from celery_dlx.wiring.runtime import get_runtime
from celery_dlx.worker.task import AutoDLXTask, DLXTask

#: Nothing listens here: a test that tried to connect would fail, not hang.
NO_BROKER = "amqp://nobody:nothing@127.0.0.1:1//"
DRAIN = "celery_dlx.worker.drain"
DLX_STRATEGY = "celery_dlx.worker.strategy:dlx_strategy"


def make_app(install: bool = True, **conf: Any) -> Celery:
    app = Celery("installtest", broker=NO_BROKER, set_as_current=False)
    if install:
        celery_dlx.install(app)
    app.conf.update(conf)
    return app


def add_task(app: Celery, **options: Any) -> Any:
    @app.task(name="proj.add", shared=False, **options)
    def add(x: int, y: int) -> int:
        return x + y

    return add


def bound(app: Celery, name: str = "proj.add") -> Any:
    app.finalize()
    return app.tasks[name]


# --- dlx_enabled = True ----------------------------------------------------------------------


def test_enabled_tasks_are_dlx_tasks_with_late_acks() -> None:
    app = make_app(dlx_enabled=True)
    add_task(app)
    task = bound(app)
    assert isinstance(task, AutoDLXTask)
    assert task._dlx_enabled_for(app)
    assert task.acks_late is True
    assert task.reject_on_worker_lost is True
    assert (task.acks_on_failure_or_timeout, task.acks_on_failure, task.acks_on_timeout) == (
        False,
        False,
        False,
    )
    assert task.Strategy == DLX_STRATEGY


def test_enabled_overrides_early_acks_from_the_settings() -> None:
    app = make_app(dlx_enabled=True, task_acks_late=False, task_reject_on_worker_lost=False)
    add_task(app)
    task = bound(app)
    assert (task.acks_late, task.reject_on_worker_lost) == (True, True)


def test_enabled_task_queues_get_dead_letter_arguments() -> None:
    events = Exchange("events", type="topic")
    app = make_app(
        dlx_enabled=True,
        task_queues=[
            Queue("billing", events, routing_key="billing.#", queue_arguments={"x-max-length": 5}),
            Queue("emails"),
            Queue("reply", exclusive=True),
            Queue("legacy", queue_arguments={"x-dead-letter-exchange": "legacy_dlx"}),
        ],
    )
    queues = app.amqp.queues
    billing = queues["billing"]
    assert isinstance(billing, DLXQueue)
    assert (billing.exchange, billing.routing_key) == (events, "billing.#")
    assert billing.queue_arguments == {"x-max-length": 5, **dead_letter_arguments("billing")}
    assert queues["emails"].queue_arguments == dead_letter_arguments("emails")
    assert queues["reply"].queue_arguments is None
    assert queues["legacy"].queue_arguments == {"x-dead-letter-exchange": "legacy_dlx"}
    assert {q.name for q in app.amqp.queues.consume_from.values()} == {
        "billing",
        "emails",
        "reply",
        "legacy",
    }


def test_enabled_default_queue_gets_dead_letter_arguments() -> None:
    app = make_app(dlx_enabled=True, task_default_queue="work")
    (queue,) = app.amqp.queues.values()
    assert isinstance(queue, DLXQueue)
    assert (queue.name, queue.routing_key) == ("work", "work")
    assert queue.queue_arguments == dead_letter_arguments("work")


def test_enabled_queue_created_on_demand_is_stored_with_dead_letter_arguments() -> None:
    app = make_app(dlx_enabled=True, task_default_queue="work")
    app.amqp.queues["new"]
    stored = dict.__getitem__(app.amqp.queues, "new")
    assert isinstance(stored, DLXQueue)
    assert stored.queue_arguments == dead_letter_arguments("new")
    assert app.amqp.queues["new"].queue_arguments == dead_letter_arguments("new")


@pytest.mark.parametrize(
    ("conf", "expected", "service"),
    [
        (
            {"dlx_exchange": "proj_dlx", "dlx_service_queue": "proj.dead"},
            dead_letter_arguments("work", "proj_dlx"),
            ("proj.dead", False),
        ),
        (
            {"dlx_quorum": True},
            dead_letter_arguments("work", quorum=True),
            ("celery_dlx.dead", True),
        ),
        (
            {"dlx_quorum": True, "dlx_delivery_limit": 50},
            dead_letter_arguments("work", quorum=True, delivery_limit=50),
            ("celery_dlx.dead", True),
        ),
    ],
)
def test_queue_arguments_follow_the_settings(
    conf: dict[str, Any], expected: dict[str, Any], service: tuple[str, bool]
) -> None:
    app = make_app(dlx_enabled=True, task_default_queue="work", **conf)
    queue = app.amqp.queues["work"]
    assert queue.queue_arguments == expected
    assert (queue.dlx_service_queue, queue.dlx_quorum_service) == service


def test_enabled_drains_in_the_worker_not_by_beat_and_keeps_other_beat_entries() -> None:
    # Issue 13: a beat tick per second was a task message and three log lines per second, sent
    # to the default queue a `-Q orders` worker never reads. The drain is a worker bootstep now.
    from celery_dlx.worker.drainer import DrainerStep

    nightly = {"task": "proj.report", "schedule": 86400.0}
    app = make_app(dlx_enabled=True, dlx_drain_interval=0.5, beat_schedule={"nightly": nightly})
    add_task(app)
    app.finalize()
    assert app.conf.beat_schedule == {"nightly": nightly}
    assert DrainerStep in app.steps["worker"]
    assert DRAIN in app.tasks  # still there for tools and an opt-in beat entry (beat_entry)


def test_enabled_replaces_the_default_worker_consumer_only() -> None:
    app = make_app(dlx_enabled=True)
    add_task(app)
    app.finalize()
    assert app.conf.worker_consumer == DLX_CONSUMER

    custom = make_app(dlx_enabled=True, worker_consumer="proj.consumer:Custom")
    add_task(custom)
    custom.finalize()
    assert custom.conf.worker_consumer == "proj.consumer:Custom"


def test_builtin_and_own_tasks_keep_plain_celery_semantics() -> None:
    app = make_app(dlx_enabled=True)
    add_task(app)
    app.finalize()
    internal = [name for name in app.tasks if name.startswith(("celery.", "celery_dlx."))]
    assert "celery.backend_cleanup" in internal and DRAIN in internal
    for name in internal:
        task = app.tasks[name]
        assert not (isinstance(task, DLXTask) and task._dlx_enabled_for(app)), name
        assert task.Strategy != DLX_STRATEGY, name
    assert app.tasks["celery.backend_cleanup"].acks_late is False
    assert app.tasks[DRAIN].acks_late is False


# --- dlx_enabled = False -----------------------------------------------------------------------


@pytest.mark.parametrize("conf", [{}, {"dlx_enabled": False}])
def test_disabled_changes_nothing(conf: dict[str, Any]) -> None:
    app = make_app(task_default_queue="work", task_queues=[Queue("a"), Queue("work")], **conf)
    add_task(app)
    task = bound(app)
    assert not task._dlx_enabled_for(app)
    assert (task.acks_late, task.reject_on_worker_lost) == (False, None)
    assert task.Strategy == "celery.worker.strategy:default"
    assert all(q.queue_arguments is None for q in app.amqp.queues.values())
    assert app.amqp.queues["new"].queue_arguments is None
    assert app.conf.worker_consumer == DEFAULT_CONSUMER
    assert DRAIN not in (app.conf.beat_schedule or {})
    # The drain task exists for tools and other beats, but nothing schedules it.
    assert DRAIN in app.tasks
    from celery_dlx.worker.drainer import DrainerStep

    assert DrainerStep not in app.steps["worker"]


def test_disabled_tasks_follow_celery_settings() -> None:
    app = make_app(task_acks_late=True, task_reject_on_worker_lost=True)
    add_task(app)
    task = bound(app)
    assert (task.acks_late, task.reject_on_worker_lost) == (True, True)
    assert task.Strategy == "celery.worker.strategy:default"


def test_disabled_app_matches_an_app_without_celery_dlx() -> None:
    with_dlx, without = make_app(), make_app(install=False)
    for app in (with_dlx, without):
        add_task(app)
        app.finalize()
    plain, auto = without.tasks["proj.add"], with_dlx.tasks["proj.add"]
    for attr in ("acks_late", "reject_on_worker_lost", "acks_on_failure_or_timeout", "Strategy"):
        assert getattr(auto, attr) == getattr(plain, attr), attr
    assert {n: q.as_dict() for n, q in with_dlx.amqp.queues.items()} == {
        n: q.as_dict() for n, q in without.amqp.queues.items()
    }


# --- misuse ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "touch",
    [lambda app: app.Task, lambda app: app.amqp, lambda app: app.amqp.queues],
    ids=["Task", "amqp", "queues"],
)
def test_install_after_the_app_was_used_is_an_error(touch: Any) -> None:
    app = make_app(install=False, dlx_enabled=True)
    touch(app)
    with pytest.raises(ConfigurationError, match=r"celery_dlx.install\(app\) must run before"):
        celery_dlx.install(app)


def test_install_after_a_task_was_defined_is_an_error() -> None:
    app = make_app(install=False, dlx_enabled=True)
    add_task(app)
    app.finalize()
    with pytest.raises(ConfigurationError, match=r"right after `app = Celery\(...\)`"):
        celery_dlx.install(app)


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("install", [True, False])
def test_misspelt_option_on_an_explicit_dlx_task_fails_at_finalize(
    enabled: bool, install: bool
) -> None:
    app = make_app(install=install, dlx_enabled=enabled)
    add_task(app, base=DLXTask, dlx_max_requeus=1)
    with pytest.raises(ConfigurationError) as info:
        app.finalize()
    assert str(info.value).startswith(
        "task proj.add: unknown option(s) dlx_max_requeus (did you mean dlx_max_requeues?); known: "
    )


def test_misspelt_option_on_a_flagged_task_fails_at_finalize() -> None:
    app = make_app(dlx_enabled=True)
    add_task(app, dlx_bakoff=[1, 2])
    with pytest.raises(
        ConfigurationError,
        match=r"^task proj.add: unknown option\(s\) dlx_bakoff \(did you mean dlx_backoff\?\);",
    ):
        app.finalize()


def test_bad_option_value_fails_at_finalize() -> None:
    app = make_app(dlx_enabled=True)
    add_task(app, dlx_importance="loud")
    with pytest.raises(ConfigurationError, match=r"^task proj.add: option dlx_importance"):
        app.finalize()


def test_task_options_reach_the_policy() -> None:
    app = make_app(dlx_enabled=True, dlx_max_parks=4)
    add_task(app, dlx_max_requeues=0, dlx_bury_on=[KeyError])
    task = bound(app)
    from celery_dlx.policy.options import resolve_task_options

    policy = resolve_task_options(type(task), get_runtime(app).config).policy
    assert (policy.max_requeues, policy.max_parks, policy.bury_on) == (0, 4, (KeyError,))


def test_bad_setting_fails_when_the_app_is_configured() -> None:
    app = make_app(dlx_enabled=True, dlx_max_parks=-1)
    add_task(app)
    with pytest.raises(ConfigurationError, match=r"^dlx_max_parks must be a non-negative integer"):
        app.finalize()


def test_unknown_setting_fails_when_the_app_is_configured() -> None:
    app = make_app(dlx_enabled=True, dlx_max_requeus=1)
    add_task(app)
    with pytest.raises(
        ConfigurationError,
        match=r"^unknown celery_dlx setting\(s\): dlx_max_requeus \(did you mean dlx_max_requeues\?\);",
    ):
        app.finalize()


def test_install_on_an_already_configured_app_applies_at_once() -> None:
    app = Celery("configured", broker=NO_BROKER, set_as_current=False)
    app.conf.update(dlx_enabled=True)
    assert app.conf.dlx_enabled is True  # loads the configuration
    assert app.configured
    celery_dlx.install(app)
    assert app.conf.worker_consumer == DLX_CONSUMER
    from celery_dlx.worker.drainer import DrainerStep

    assert DrainerStep in app.steps["worker"]
    add_task(app)
    assert bound(app).acks_late is True


def test_pool_process_start_warms_only_the_workers_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """worker_process_init has no sender: only the app the pool process runs (the current one)
    connects, never another app of the same process (before: every installed app did, each
    retrying an unreachable broker while the pool process could not start its tasks). Fate
    listeners (the event connection) warm where tasks run: not in a prefork worker's main
    process."""
    from celery import signals
    from celery._state import _set_current_app, get_current_app
    from celery.concurrency.prefork import TaskPool

    from celery_dlx.wiring.runtime import Runtime

    warmed: list[tuple[str, bool]] = []

    def warm(self: Runtime, *, listeners: bool = True) -> None:
        warmed.append((self.app.main, listeners))

    monkeypatch.setattr(Runtime, "warm", warm)
    mine = make_app(dlx_enabled=True)
    mine.main = "mine"
    other = make_app(dlx_enabled=True)
    other.main = "other"
    previous = get_current_app()
    _set_current_app(mine)
    try:
        signals.worker_process_init.send(sender=None)
    finally:
        _set_current_app(previous)
    assert warmed == [("mine", True)]
    warmed.clear()

    class Consumer:  # what worker_ready is sent by: the worker's consumer, with its app
        app = other
        pool: object = None  # solo and threads pools run tasks in the worker process

    signals.worker_ready.send(sender=Consumer())
    assert warmed == [("other", True)]
    warmed.clear()
    Consumer.pool = TaskPool(limit=1)  # not started: only its type matters
    signals.worker_ready.send(sender=Consumer())
    assert warmed == [("other", False)]


def test_an_installed_app_that_is_dropped_is_not_kept_alive() -> None:
    """The worker start signals are global: they must not hold every app ever installed (a test
    session's, a script's), nor call a receiver per app at each worker start."""
    import gc
    import weakref

    from celery import signals

    receivers = len(signals.worker_process_init.receivers)
    app = make_app(dlx_enabled=True)
    add_task(app)
    get_runtime(app)
    make_app(dlx_enabled=True)
    assert len(signals.worker_process_init.receivers) == receivers
    gone = weakref.ref(app)
    del app
    gc.collect()
    assert gone() is None
