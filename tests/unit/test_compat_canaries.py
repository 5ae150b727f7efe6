"""Canaries of the internals in celery_dlx/compat/ and celery_dlx_spark/compat.py not already
checked by test_compat.py, test_amqp_compat.py and test_compat_versions.py.

A failure here means an upgrade of the library named in the message moved an internal celery_dlx
relies on: fix the function named in the message before releasing.
"""

from __future__ import annotations

import codecs
import inspect
import re
import sys
from importlib.metadata import version
from types import SimpleNamespace
from typing import Any

import amqp
import pytest
from amqp import method_framing
from billiard.einfo import ExceptionInfo
from celery import Celery, Task
from celery.worker.consumer import Consumer
from celery.worker.request import Request

from celery_dlx.compat import billiard as billiard_compat
from celery_dlx.compat import celery as celery_compat
from celery_dlx.compat import python as python_compat
from celery_dlx.compat import redis as redis_compat

NO_BROKER = "amqp://nobody:nothing@127.0.0.1:1//"


def moved(dist: str, internal: str, where: str) -> str:
    return (
        f"{dist} {version(dist)} changed {internal}, which celery_dlx relies on: "
        f"update {where} for this version"
    )


# -- Celery -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hook", "parameters"),
    [
        ("connection_for_read", ["self", "heartbeat"]),
        ("create_task_handler", ["self", "promise"]),
        ("on_decode_error", ["self", "message", "exc"]),
        ("on_unknown_message", ["self", "body", "message"]),
        ("on_unknown_task", ["self", "body", "message", "exc"]),
        ("on_invalid_task", ["self", "body", "message", "exc"]),
    ],
)
def test_celery_consumer_hooks(hook: str, parameters: list[str]) -> None:
    method = getattr(Consumer, hook, None)
    assert callable(method), moved("celery", f"Consumer.{hook}", "compat/celery.py ConsumerHooks")
    assert list(inspect.signature(method).parameters) == parameters, moved(
        "celery", f"Consumer.{hook}'s arguments", "compat/celery.py ConsumerHooks"
    )


def test_celery_consumer_calls_its_hooks() -> None:
    """Celery's task handler reads each hook off the consumer when it is made (so a subclass's
    method is the one it calls)."""
    source = inspect.getsource(Consumer.create_task_handler)
    for hook in ("on_unknown_message", "on_unknown_task", "on_invalid_task", "on_decode_error"):
        assert f"self.{hook}" in source, moved(
            "celery", f"create_task_handler calling Consumer.{hook}", "ConsumerHooks"
        )


def test_celery_request_acks_an_ignored_run_through_acknowledge() -> None:
    """``divert_acknowledge`` relies on ``on_failure`` acking through ``self.acknowledge()``."""
    source = inspect.getsource(Request.on_failure)
    assert "self.acknowledge()" in source, moved(
        "celery", "Request.on_failure (no self.acknowledge())", "compat/celery.py"
    )
    for name in ("acknowledge", "reject"):
        assert callable(getattr(Request, name, None)), moved("celery", f"Request.{name}", "")
    assert isinstance(inspect.getattr_static(Request, "request_dict"), property), moved(
        "celery", "Request.request_dict", "compat/celery.py set_request_header"
    )


def test_divert_acknowledge_shadows_the_method_once() -> None:
    request: Any = object.__new__(celery_compat.NotifyingRequest)
    calls: list[str] = []
    celery_compat.divert_acknowledge(request, lambda: calls.append("instead"))
    request.acknowledge()
    assert calls == ["instead"]
    assert "acknowledge" not in vars(request)  # the next ack is the class's own


def test_celery_acks_go_through_the_consumer_s_call_soon() -> None:
    """``acknowledge_from_thread``: the ack reaches kombu's ``Hub.call_soon`` through Celery's
    consumer."""
    from kombu.asynchronous.hub import Hub

    assert callable(getattr(Consumer, "call_soon", None)), moved(
        "celery", "Consumer.call_soon", "compat/celery.py acknowledge_from_thread"
    )
    assert "hub.call_soon" in inspect.getsource(Consumer.call_soon), moved(
        "celery", "Consumer.call_soon (not kombu's Hub.call_soon)", "acknowledge_from_thread"
    )
    assert callable(getattr(Hub, "call_soon", None)), moved("kombu", "Hub.call_soon", "")


def test_celery_pool_names_are_their_modules() -> None:
    """``worker_pool_name`` reads the module of ``WorkController.pool_cls``; the settler and the
    loop wake know the pools by those names."""
    from celery.concurrency import get_implementation
    from celery.worker import WorkController

    assert "self.pool_cls" in inspect.getsource(WorkController), moved(
        "celery", "WorkController.pool_cls", "compat/celery.py worker_pool_name"
    )
    for pool, name in (("prefork", "prefork"), ("solo", "solo"), ("threads", "thread")):
        worker = SimpleNamespace(pool_cls=get_implementation(pool))
        assert celery_compat.worker_pool_name(worker) == name, moved(  # type: ignore[arg-type]
            "celery", f"the module of the {pool} pool", "compat/celery.py worker_pool_name"
        )


def test_celery_tasks_step_sets_task_consumer() -> None:
    from celery.worker.consumer.tasks import Tasks

    assert "c.task_consumer = " in inspect.getsource(Tasks.start), moved(
        "celery", "Consumer.task_consumer", "compat/celery.py task_queue_tags"
    )


def test_celery_default_strategy_signature() -> None:
    from celery.worker.strategy import default

    assert list(inspect.signature(default).parameters)[:3] == ["task", "app", "consumer"]
    assert re.search(
        r"def task_message_handler\(message, body, ack, reject, callbacks",
        inspect.getsource(default),
    ), moved("celery", "the default strategy's handler", "compat/celery.py default_strategy")


def test_celery_sets_and_calls_a_task_s_tracer_as_its___trace__() -> None:
    from celery.app import trace

    assert "__trace__" in vars(Task), moved("celery", "Task.__trace__", "TracerHook")
    assert re.search(r"\.__trace__ = build_tracer\(", inspect.getsource(trace)), moved(
        "celery", "build_tracer set as task.__trace__", "compat/celery.py TracerHook"
    )


def test_the_installed_celery_takes_the_push_request_side_its_release_says() -> None:
    copies = "self.request.__dict__" in inspect.getsource(Task.push_request)
    assert copies == (celery_compat.CELERY_RELEASE >= (5, 5)), moved(
        "celery", "Task.push_request", "compat/celery.py push_request_keeping_fields"
    )


def test_push_request_keeps_the_fields_on_either_side(monkeypatch: pytest.MonkeyPatch) -> None:
    app = Celery("canary", broker=NO_BROKER, set_as_current=False)

    @app.task(shared=False)
    def noop() -> None: ...

    for release in ((5, 3), celery_compat.CELERY_RELEASE):
        monkeypatch.setattr(celery_compat, "CELERY_RELEASE", release)
        noop.push_request(id="run-1", retries=2)
        try:
            celery_compat.push_request_keeping_fields(noop, args=(1,))
            try:
                assert (noop.request.id, noop.request.retries) == ("run-1", 2), release
                assert noop.request.args == (1,)
            finally:
                noop.pop_request()
        finally:
            noop.pop_request()


# -- billiard ---------------------------------------------------------------------------------------


def test_billiard_exception_info_sets_what_the_lazy_one_waits_for() -> None:
    try:
        raise ValueError("x")
    except ValueError:
        einfo = ExceptionInfo(sys.exc_info())
    assert set(vars(einfo)) <= billiard_compat.EINFO_ATTRS, moved(
        "billiard", "ExceptionInfo.__init__ (sets more)", "compat/billiard.py EINFO_ATTRS"
    )
    assert "__getstate__" not in vars(ExceptionInfo), moved(
        "billiard", "ExceptionInfo's pickled state", "compat/billiard.py LazyExceptionInfo"
    )


# -- py-amqp ----------------------------------------------------------------------------------------


def test_py_amqp_frame_writer_encodes_properties_with_serialize_properties() -> None:
    assert "_serialize_properties()" in inspect.getsource(method_framing.frame_writer), moved(
        "amqp", "frame_writer's property encoding", "compat/amqp.py EncodedMessage"
    )
    assert isinstance(inspect.getattr_static(amqp.Connection, "on_inbound_frame"), property), moved(
        "amqp", "Connection.on_inbound_frame", "compat/amqp.py inbound_frame_handler"
    )


# -- redis-py ---------------------------------------------------------------------------------------

#: What redis-py's client reads of its connection pool (redis-py 5.0.0 and 8.1.0):
#: ``HeldConnectionPool`` lends its one connection through the first two, and passes the others
#: on to the real pool. A new one may lend another connection, past the held one.
POOL_ATTRIBUTES = {
    "get_connection",
    "release",
    "get_encoder",
    "connection_kwargs",
    "set_retry",
    "close",
    "cache",
    "get_protocol",
    "himport_registry",
}


def test_redis_py_client_reads_only_known_pool_attributes() -> None:
    import redis.client

    used = set(re.findall(r"\.connection_pool\.(\w+)", inspect.getsource(redis.client)))
    assert {"get_connection", "release"} <= used
    assert used <= POOL_ATTRIBUTES, moved(
        "redis",
        f"the pool attributes its client reads ({sorted(used - POOL_ATTRIBUTES)})",
        "compat/redis.py HeldConnectionPool",
    )


def test_held_pool_lends_its_one_connection_and_gives_it_back_once() -> None:
    class Pool:
        connection_kwargs = {"db": 3}

        def __init__(self) -> None:
            self.released: list[object] = []

        def get_connection(self) -> object:
            return "the connection"

        def release(self, connection: object) -> None:
            self.released.append(connection)

    pool = Pool()
    held = redis_compat.HeldConnectionPool(pool)
    assert held.get_connection("GET") == held.get_connection() == "the connection"
    held.release("the connection")
    assert pool.released == []
    assert held.connection_kwargs == {"db": 3}
    held.close(broken=False)
    assert pool.released == ["the connection"]


def test_redis_py_cluster_keeps_its_slot_map_in_nodes_manager() -> None:
    from redis.cluster import NodesManager, RedisCluster

    assert "self.nodes_manager = NodesManager(" in inspect.getsource(RedisCluster.__init__), moved(
        "redis", "RedisCluster.nodes_manager", "compat/redis.py refresh_slot_map"
    )
    assert callable(getattr(NodesManager, "initialize", None)), moved(
        "redis", "NodesManager.initialize", "compat/redis.py refresh_slot_map"
    )


# -- the standard library ---------------------------------------------------------------------------


def test_codec_info_tells_text_encodings_from_transforms() -> None:
    assert python_compat.is_text_codec(codecs.lookup("latin-1"))
    assert not python_compat.is_text_codec(codecs.lookup("hex")), (
        f"Python {sys.version.split()[0]} changed CodecInfo._is_text_encoding: "
        "update celery_dlx/compat/python.py"
    )


# -- pyspark ----------------------------------------------------------------------------------------


def test_pyspark_context_internals() -> None:
    pytest.importorskip("pyspark")
    from pyspark import SparkContext

    assert "_jvm" in vars(SparkContext), moved(
        "pyspark", "SparkContext._jvm", "celery_dlx_spark/compat.py"
    )
    assert callable(getattr(SparkContext, "_ensure_initialized", None)), moved(
        "pyspark", "SparkContext._ensure_initialized", "celery_dlx_spark/compat.py join_gateway"
    )
    assert "self._jsc = " in inspect.getsource(SparkContext), moved(
        "pyspark", "SparkContext._jsc", "celery_dlx_spark/compat.py hadoop_configuration"
    )
