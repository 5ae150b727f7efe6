"""Every private internal fenced in celery_dlx.compat, checked against the installed libraries.

A failure here means an upgrade of the library named in the message removed or changed an
internal celery_dlx relies on: fix the function in celery_dlx/compat.py before releasing.
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
from celery_dlx.worker.runtime import Runtime

NO_BROKER = "amqp://nobody:nothing@127.0.0.1:1//"


def broken(dist: str, internal: str) -> str:
    return (
        f"{dist} {version(dist)} changed {internal}, which celery_dlx relies on: "
        f"update celery_dlx/compat.py for this version"
    )


# -- py-amqp --------------------------------------------------------------------------------------


def test_py_amqp_property_decoders_and_pstr_t() -> None:
    classes = getattr(serialization, "PROPERTY_CLASSES", None)
    assert isinstance(classes, dict), broken("amqp", "amqp.serialization.PROPERTY_CLASSES")
    assert callable(classes.get(amqp.spec.Basic.CLASS_ID)), broken(
        "amqp", "PROPERTY_CLASSES[Basic.CLASS_ID] (the basic properties decoder)"
    )
    decoder = serialization.decode_properties_basic
    # The swap works only while the decoder reads the module global `pstr_t` at call time.
    assert "pstr_t" in decoder.__code__.co_names, broken("amqp", "decode_properties_basic's pstr_t")
    assert decoder.__globals__ is vars(serialization), broken("amqp", "amqp.serialization.pstr_t")

    compat.install_tolerant_properties()
    frame = bytes(amqp.Message(b"x", message_id=b"\xff-id")._serialize_properties())
    props, _ = serialization.PROPERTY_CLASSES[amqp.spec.Basic.CLASS_ID](frame, 0)
    assert props["message_id"] == "\ufffd-id", broken("amqp", "short-string decoding")


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


# -- billiard -------------------------------------------------------------------------------------


def _failure() -> BaseException:
    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        raise KeyError(f"missing {n}")

    try:
        deep(5)
    except KeyError as exc:
        return exc
    raise AssertionError("unreachable")


def test_billiard_tracebacks_share_code_positions_and_format_the_same() -> None:
    import pickle
    import traceback

    from billiard.einfo import ExceptionInfo

    exc = _failure()
    exc_info = (type(exc), exc, exc.__traceback__)
    before = ExceptionInfo(exc_info)
    compat.share_code_positions()
    compat.share_code_positions()  # idempotent
    after, again = ExceptionInfo(exc_info), ExceptionInfo(exc_info)
    assert after.traceback == before.traceback
    # The copied traceback formats as before, carets included, also after a pickle round trip
    # (prefork sends it to the parent, which logs it).
    for einfo in (after, pickle.loads(pickle.dumps(after))):
        assert traceback.format_exception(type(exc), exc, einfo.tb) == (
            traceback.format_exception(type(exc), exc, before.tb)
        ), broken("billiard", "einfo._Code (how a traceback copy keeps co_positions)")
    if sys.version_info >= (3, 11):
        assert after.tb.tb_frame.f_code._co_positions is again.tb.tb_frame.f_code._co_positions
        assert after.tb.tb_frame.f_code._co_positions  # the real positions, not the empty stand-in


def test_billiard_tracebacks_pickle_only_the_positions_they_point_at() -> None:
    """A prefork pool process pickles the ExceptionInfo of every failed, retried or ignored run
    to its parent. Built by Celery's own tracer, it held every position of ``trace_task``
    (about 32 KB); now only those its frames point at, and it formats the same, carets
    included, after the round trip."""
    import pickle
    import traceback

    from billiard.einfo import ExceptionInfo
    from celery import Celery
    from celery.app.trace import build_tracer

    compat.share_code_positions()
    app = Celery("einfo-size", set_as_current=False)

    @app.task(name="einfo.fail", shared=False)
    def fail() -> None:
        values: dict[str, int] = {}
        _ = values["a"] + len(values) * 2  # carets (~~~~~~^^^^^)

    tracer = build_tracer(fail.name, fail, app=app, eager=False, propagate=False)
    einfo = tracer("id-1", (), {}, {"id": "id-1", "delivery_info": {}})[0]
    assert isinstance(einfo, ExceptionInfo)
    copy = pickle.loads(pickle.dumps(einfo, protocol=pickle.HIGHEST_PROTOCOL))
    exc = einfo.exception
    formatted = traceback.format_exception(type(exc), exc, einfo.tb)
    assert traceback.format_exception(type(exc), exc, copy.tb) == formatted, broken(
        "billiard", "einfo._Code/_Frame/Traceback (what a traceback copy pickles)"
    )
    if sys.version_info >= (3, 11):
        assert "^^^^" in "".join(formatted)
        assert len(pickle.dumps(einfo, protocol=pickle.HIGHEST_PROTOCOL)) < 8000
        positions = copy.tb.tb_frame.f_code._co_positions  # trace_task's frame
        assert isinstance(positions, compat.SparsePositions)
        assert positions.length > 1000 and len(positions.known) <= 2


def _caret_failure() -> BaseException:
    values: dict[str, int] = {}
    try:
        _ = values["a"] + len(values) * 2  # a segment with carets (~~~~~~^^^^^)
    except KeyError as exc:
        return exc
    raise AssertionError("unreachable")


def test_traceback_positions_and_carets_cached_format_the_same() -> None:
    import traceback

    failures = [_failure(), _caret_failure()]
    before = ["".join(traceback.format_exception(exc)) for exc in failures]
    compat.cache_traceback_positions()
    compat.cache_traceback_positions()  # idempotent
    for _ in range(2):  # the second time from the caches
        after = ["".join(traceback.format_exception(exc)) for exc in failures]
        assert after == before, broken_python("traceback._get_code_position and carets")
    if sys.version_info[:2] in ((3, 11), (3, 12)):
        assert "^^^^" in before[1]
        position = traceback._get_code_position  # type: ignore[attr-defined]
        assert position.__module__ == "celery_dlx.compat", broken_python("traceback internals")


def broken_python(internal: str) -> str:
    return f"Python {sys.version.split()[0]} changed {internal}: update celery_dlx/compat.py"
