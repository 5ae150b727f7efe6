"""Every private internal fenced in celery_dlx.compat, checked against the installed libraries.

A failure here means an upgrade of the library named in the message removed or changed an
internal celery_dlx relies on: fix the function in celery_dlx/compat/ (the module of that
library) before releasing.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from importlib.metadata import version
from types import SimpleNamespace
from typing import Any

import amqp
import pytest
from amqp import serialization
from celery import Celery
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu import Connection, Consumer, Queue
from kombu.message import Message

from celery_dlx import compat
from celery_dlx.errors import ConfigurationError
from celery_dlx.integrations.sentry import install_sentry
from celery_dlx.policy.config import load_config
from celery_dlx.wiring.runtime import Runtime

NO_BROKER = "amqp://nobody:nothing@127.0.0.1:1//"


def broken(dist: str, internal: str) -> str:
    return (
        f"{dist} {version(dist)} changed {internal}, which celery_dlx relies on: "
        f"update celery_dlx/compat/ for this version"
    )


# -- py-amqp --------------------------------------------------------------------------------------


def test_py_amqp_basic_properties_decoder() -> None:
    """celery_dlx's frame reader calls py-amqp's decoder first (``broker/frames.py``)."""
    decoder = getattr(serialization, "decode_properties_basic", None)
    assert callable(decoder), broken("amqp", "amqp.serialization.decode_properties_basic")
    frame = bytes(amqp.Message(b"x", message_id="m-1")._serialize_properties())
    props, offset = decoder(frame, 0)
    assert props["message_id"] == "m-1" and offset == len(frame), broken(
        "amqp", "decode_properties_basic(buf, offset) -> (properties, offset)"
    )


# -- kombu ----------------------------------------------------------------------------------------


class ExtraQueue(Queue):
    attrs = compat.queue_attrs(("extra", None))
    extra: str | None = None


@pytest.fixture
def memory() -> Iterator[Connection]:
    with Connection("memory://") as conn:
        yield conn


def test_kombu_queue_attrs_survive_copy_and_bind(memory: Connection) -> None:
    assert isinstance(Queue.attrs, tuple) and ("name", None) in Queue.attrs, broken(
        "kombu", "kombu.Queue.attrs"
    )
    queue = ExtraQueue("compat-attrs", extra="kept", queue_arguments={"x-max-length": 1})
    for kept in (copy.copy(queue), queue(memory.channel())):
        assert isinstance(kept, ExtraQueue), broken("kombu", "Queue copying (Object.__copy__)")
        assert kept.extra == "kept", broken("kombu", "Queue copies built from Object.attrs")
        assert kept.queue_arguments == {"x-max-length": 1}


def test_kombu_consumer_tags_are_the_tags_given_to_the_broker(memory: Connection) -> None:
    channel = memory.channel()
    sent: dict[str, str] = {}
    basic_consume = channel.basic_consume

    def recording(queue: str, *args: Any, **kwargs: Any) -> Any:
        sent[queue] = kwargs["consumer_tag"]
        return basic_consume(queue, *args, **kwargs)

    channel.basic_consume = recording
    queues = [Queue("compat-tags-a"), Queue("compat-tags-b")]
    consumer = Consumer(channel, queues, callbacks=[lambda body, message: None])
    assert compat.consumer_tags(consumer) == {}
    consumer.consume()
    try:
        assert sent, broken("kombu", "Consumer.consume (no basic_consume with a consumer_tag)")
        assert compat.consumer_tags(consumer) == sent, broken("kombu", "Consumer._active_tags")
    finally:
        consumer.cancel()
    assert compat.consumer_tags(object()) == {}


def test_kombu_serializer_name_by_content_type() -> None:
    assert compat.serializer_name("application/json") == "json", broken(
        "kombu", "kombu.serialization.registry.type_to_name"
    )
    assert compat.serializer_name("application/x-nothing-registered") is None


# -- celery ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("touch", ["Task", "amqp"])
def test_celery_caches_task_and_amqp_in_the_app_dict(touch: str) -> None:
    app = Celery("compat", broker=NO_BROKER, set_as_current=False)
    assert not compat.app_task_or_amqp_made(app)
    getattr(app, touch)
    assert compat.app_task_or_amqp_made(app), broken(
        "celery", f"Celery.{touch} (no longer a cached property in the app's __dict__)"
    )


def _message() -> Message:
    return Message(
        body=b"{}",
        delivery_tag=1,
        content_type="application/json",
        content_encoding="utf-8",
        delivery_info={"routing_key": "q", "exchange": ""},
        properties={},
        headers={"id": "compat-1", "task": "proj.missing"},
    )


@pytest.mark.parametrize("hook", ["on_unknown_message", "on_unknown_task", "on_invalid_task"])
def test_celery_rejects_through_reject_log_error(hook: str) -> None:
    """Celery's consumer must reject an unknown/invalid message with ``reject_log_error``."""
    app = Celery("compat", broker=NO_BROKER, backend="cache+memory://", set_as_current=False)
    consumer = SimpleNamespace(
        app=app,
        connection_errors=(),
        event_dispatcher=None,
        _message_report=lambda body, message: "report",
    )
    message = _message()
    calls: list[tuple[Any, ...]] = []
    compat.divert_reject(message, lambda log, errors, requeue=False: calls.append((log, errors)))
    args: tuple[Any, ...] = ({}, message)
    if hook != "on_unknown_message":
        args = (*args, KeyError("proj.missing"))
    getattr(CeleryConsumer, hook)(consumer, *args)
    assert len(calls) == 1, broken("celery", f"Consumer.{hook} (no message.reject_log_error)")
    assert calls[0][1] == (), broken("celery", f"Consumer.{hook}'s reject_log_error arguments")
    assert message.acknowledged is False  # only the diverted reject ran


# -- sentry-sdk -----------------------------------------------------------------------------------


def test_sentry_global_event_processors_once() -> None:
    from sentry_sdk import scope

    assert isinstance(getattr(scope, "global_event_processors", None), list), broken(
        "sentry-sdk", "sentry_sdk.scope.global_event_processors"
    )

    def processor(event: Any, hint: Any) -> Any:
        return event

    try:
        compat.add_sentry_event_processor_once(processor)
        compat.add_sentry_event_processor_once(processor)
        assert scope.global_event_processors.count(processor) == 1, broken(
            "sentry-sdk", "add_global_event_processor (not appending to global_event_processors)"
        )
    finally:
        while processor in scope.global_event_processors:
            scope.global_event_processors.remove(processor)


# -- optional integrations are never switched off silently ----------------------------------------


def _config_with_sentry_sdk(conf: dict[str, Any]) -> Any:
    with pytest.MonkeyPatch.context() as patch:
        patch.delitem(sys.modules, "sentry_sdk", raising=False)
        return load_config(conf)


@pytest.fixture
def no_sentry_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """sentry-sdk as if not installed: every ``import sentry_sdk...`` raises ImportError."""
    for name in [m for m in sys.modules if m == "sentry_sdk" or m.startswith("sentry_sdk.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "sentry_sdk", None)


def _runtime(**conf: Any) -> Runtime:
    app = Celery("compat", broker=NO_BROKER, set_as_current=False)
    return Runtime(app, load_config(conf))


@pytest.mark.usefixtures("no_sentry_sdk")
@pytest.mark.parametrize(
    "conf",
    [{"dlx_sentry": True}, {"dlx_sentry_rate_limit": 3}, {"DLX_SENTRY_INCLUDE_PAYLOAD": True}],
)
def test_configured_sentry_without_sentry_sdk_raises(conf: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match=r"celery-dlx\[sentry\]"):
        load_config(conf)
    # A runtime built from settings validated while sentry-sdk was importable.
    runtime = Runtime(
        Celery("compat", broker=NO_BROKER, set_as_current=False), _config_with_sentry_sdk(conf)
    )
    with pytest.raises(ConfigurationError, match=r"celery-dlx\[sentry\]"):
        install_sentry(runtime)


@pytest.mark.usefixtures("no_sentry_sdk")
def test_default_sentry_without_sentry_sdk_is_skipped() -> None:
    assert install_sentry(_runtime()) is None
    assert install_sentry(_runtime(dlx_sentry=False)) is None


@pytest.mark.usefixtures("no_sentry_sdk")
def test_install_raises_for_a_configured_sentry_without_sentry_sdk() -> None:
    import celery_dlx

    app = Celery("compat", broker=NO_BROKER, set_as_current=False)
    celery_dlx.install(app)
    app.conf.update(dlx_enabled=True, dlx_sentry=True)

    @app.task(name="compat.noop", shared=False)
    def noop() -> None: ...

    with pytest.raises(ConfigurationError, match=r"dlx_sentry set but sentry-sdk.*\[sentry\]"):
        app.finalize()  # loads and validates the dlx_* settings


@pytest.mark.usefixtures("no_sentry_sdk")
def test_load_config_names_the_extra_for_configured_sentry() -> None:
    with pytest.raises(ConfigurationError, match=r"^dlx_sentry_rate_limit set .*\[sentry\]"):
        load_config({"dlx_sentry_rate_limit": 3})
    assert load_config({"dlx_sentry": False, "dlx_sentry_rate_limit": 3}).sentry is False
    assert load_config({}).sentry is True  # on by default: skipped without sentry-sdk


# -- Celery: a requeued or parked run ends without a traceback ------------------------------------


def test_celery_tracer_lets_a_settled_run_through_and_the_parent_acks_it() -> None:
    """Celery's tracer re-raises a BaseException after its cleanup; the settling tracer reports the
    run as an ignored one, which the worker's parent acks, with no traceback built or pickled."""
    import pickle

    from celery import Task, signals
    from celery.app.trace import build_tracer
    from celery.exceptions import Ignore
    from celery.worker.request import Request

    app = Celery("compat-settle", broker=NO_BROKER, set_as_current=False)
    postrun: list[Any] = []

    class Settling(Task):  # type: ignore[type-arg]
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            super().__call__(*args, **kwargs)
            raise compat.RunSettled()

    @app.task(base=Settling, name="compat.settled", shared=False)
    def settled() -> None: ...

    def on_postrun(sender: Any = None, **kwargs: Any) -> None:
        postrun.append(kwargs["task_id"])

    signals.task_postrun.connect(on_postrun, sender=settled, weak=False)
    try:
        tracer = compat.settling_tracer(build_tracer(settled.name, settled, app=app))
        assert compat.settling_tracer(tracer) is tracer  # wrapped once
        retval, info, runtime, _ = tracer("id-1", (), {}, {"id": "id-1", "delivery_info": {}})
    finally:
        signals.task_postrun.disconnect(on_postrun, sender=settled)
    assert info, broken("celery", "build_tracer (a tracer returns trace_ok_t(R, I, T, Rstr))")
    assert postrun == ["id-1"], broken("celery", "trace_task (task_postrun of a BaseException)")
    assert not settled.request_stack.stack, broken("celery", "trace_task (request stack)")
    assert isinstance(retval.exception, Ignore) and retval.tb is None and runtime >= 0
    sent = pickle.dumps((1, retval, runtime), protocol=pickle.HIGHEST_PROTOCOL)
    assert len(sent) < 400  # what a prefork pool process sends its parent

    message = Message(
        body=b"[[], {}, {}]",
        delivery_tag=1,
        content_type="application/json",
        content_encoding="utf-8",
        delivery_info={"routing_key": "q", "exchange": ""},
        properties={},
        headers={"id": "id-1", "task": settled.name},
    )
    acks: list[Any] = []
    rejects: list[Any] = []
    request = Request(
        message,
        app=app,
        task=settled,
        on_ack=lambda *args: acks.append(args),
        on_reject=lambda *args: rejects.append(args),
    )
    request.on_success(pickle.loads(sent))
    assert len(acks) == 1 and not rejects, broken(
        "celery", "Request.on_success/on_failure (an Ignore is acked)"
    )


def test_celery_worker_sets_the_tracer_as_task_attribute() -> None:
    """The worker hands each task its tracer by assigning ``task.__trace__``, so a DLX task's
    property sees it (the prefork pool process at start, the consumer for the other pools)."""
    import inspect

    from celery.concurrency import prefork
    from celery.worker.consumer import consumer

    for module, function in (
        (prefork, prefork.process_initializer),
        (consumer, consumer.Consumer.update_strategies),
    ):
        assert "task.__trace__ = build_tracer(" in inspect.getsource(function), broken(
            "celery", f"{module.__name__}.{function.__qualname__} (task.__trace__ assignment)"
        )
