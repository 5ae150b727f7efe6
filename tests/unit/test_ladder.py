"""The TTL delay-queue ladder: names, arguments, rounding, declare cache; I/O on fakes."""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest
import redis
from amqp.exceptions import PreconditionFailed
from hypothesis import given
from hypothesis import strategies as st

from celery_dlx.broker.ladder import (
    DECLARE_REFRESH,
    EXPIRES_MARGIN,
    MAX_QUEUE_NAME,
    DeclareCache,
    Ladder,
    delay_queue_arguments,
    delay_queue_name,
    expires_ms,
    format_seconds,
    round_up,
)
from celery_dlx.docs_url import doc_url
from celery_dlx.errors import ConfigurationError, PublishError, TopologyError
from celery_dlx.fates import PARKED, FateEvent
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.policy.config import load_config
from celery_dlx.policy.durations import ladder_ms
from celery_dlx.wiring.runtime import Runtime

# --- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (1, "0.001"),
        (200, "0.2"),
        (250, "0.25"),
        (1000, "1"),
        (1250, "1.25"),
        (1001, "1.001"),
        (5000, "5"),
        (3600000, "3600"),
    ],
)
def test_format_seconds_is_stable_and_exact(ms: int, text: str) -> None:
    assert format_seconds(ms) == text


@given(st.integers(min_value=1, max_value=10**9))
def test_format_seconds_round_trips_to_the_same_milliseconds(ms: int) -> None:
    text = format_seconds(ms)
    assert round(float(text) * 1000) == ms
    assert not text.endswith(".") and (("." not in text) or not text.endswith("0"))


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "5"])
def test_format_seconds_rejects_what_is_not_positive_milliseconds(bad: Any) -> None:
    with pytest.raises(ValueError, match="positive number of ms"):
        format_seconds(bad)


def test_delay_queue_name_follows_the_seed_convention() -> None:
    assert delay_queue_name("orders", 5000) == "orders_dlq_5"
    assert delay_queue_name("orders", 200) == "orders_dlq_0.2"
    assert delay_queue_name("a.b-c", 3600000) == "a.b-c_dlq_3600"


def test_delay_queue_name_of_a_long_queue_stays_within_255_bytes_and_unique() -> None:
    base = "é" * 200  # 400 bytes in UTF-8
    one = delay_queue_name(base + "x", 1000)
    two = delay_queue_name(base + "y", 1000)
    assert len(one.encode("utf-8")) <= MAX_QUEUE_NAME
    assert one != two and one.endswith("_dlq_1") and two.endswith("_dlq_1")
    assert one == delay_queue_name(base + "x", 1000)  # stable
    one.encode("utf-8").decode("utf-8")  # never a split character


def test_delay_queue_name_needs_a_queue() -> None:
    with pytest.raises(ValueError, match="work queue"):
        delay_queue_name("", 1000)


# --- arguments -------------------------------------------------------------------------------


def test_classic_delay_queue_arguments() -> None:
    assert delay_queue_arguments("orders", 5000) == {
        "x-message-ttl": 5000,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "orders",
        "x-expires": 5000 + int(EXPIRES_MARGIN * 1000),
    }


def test_quorum_delay_queue_dead_letters_at_least_once() -> None:
    args = delay_queue_arguments("orders", 200, quorum=True)
    assert args["x-queue-type"] == "quorum"
    assert args["x-dead-letter-strategy"] == "at-least-once"
    assert args["x-overflow"] == "reject-publish"  # RabbitMQ requires it for at-least-once
    assert args["x-message-ttl"] == 200 and args["x-dead-letter-exchange"] == ""


@given(st.integers(min_value=1, max_value=10**8))
def test_an_unused_queue_expires_only_after_its_last_message_left(ms: int) -> None:
    # The last message published after the last declare leaves by refresh + TTL.
    assert expires_ms(ms) > ms + DECLARE_REFRESH * 1000


# --- rounding --------------------------------------------------------------------------------

STEPS = (200, 500, 1000)


@pytest.mark.parametrize(
    ("delay", "expected"),
    [
        (0, (200, False)),
        (1, (200, False)),
        (200, (200, False)),
        (201, (500, False)),
        (300, (500, False)),
        (500, (500, False)),
        (999, (1000, False)),
        (1000, (1000, False)),
        (1001, (1000, True)),
        (10**9, (1000, True)),
    ],
)
def test_round_up_to_the_next_step(delay: int, expected: tuple[int, bool]) -> None:
    assert round_up(delay, STEPS) == expected


@given(
    st.lists(st.integers(min_value=1, max_value=10**7), min_size=1, unique=True).map(sorted),
    st.integers(min_value=0, max_value=10**8),
)
def test_round_up_never_shortens_a_delay_it_can_cover(steps: list[int], delay: int) -> None:
    step, clamped = round_up(delay, steps)
    assert step in steps
    if clamped:
        assert step == steps[-1] < delay
    else:
        assert step >= delay and all(s < delay for s in steps if s < step)


def test_ladder_ms_of_the_default_ladder() -> None:
    config = load_config({})
    seconds = (1, 5, 10, 30, 60, 300, 900, 3600)
    assert ladder_ms(config.ttl_ladder) == tuple(s * 1000 for s in seconds)


@pytest.mark.parametrize(
    ("ladder", "match"),
    [
        ([], "at least one step"),
        ([0.0004, 1], "at least 0.001 s"),
        ([0.0011, 0.0012], "differ by at least 1 ms"),
    ],
)
def test_ladder_ms_rejects_unusable_ladders(ladder: list[float], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match) as err:
        ladder_ms(ladder)
    assert "dlx_ttl_ladder" in str(err.value)


# --- declare cache ---------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_declare_cache_trusts_a_declare_for_the_refresh_time_only() -> None:
    clock = Clock()
    cache = DeclareCache(refresh=60.0, clock=clock)
    assert not cache.fresh("q_dlq_1")
    cache.mark("q_dlq_1")
    clock.now += 59.9
    assert cache.fresh("q_dlq_1")
    clock.now += 0.2
    assert not cache.fresh("q_dlq_1")
    cache.mark("q_dlq_1")
    assert cache.fresh("q_dlq_1")
    cache.forget("q_dlq_1")
    assert not cache.fresh("q_dlq_1")


# --- Ladder on a fake broker -----------------------------------------------------------------


class FakeChannel:
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.is_open = True

    def queue_declare(self, name: str, **kwargs: Any) -> None:
        self.broker.declared.append((name, kwargs))
        existing = self.broker.queues.get(name)
        if existing is not None and existing != kwargs["arguments"]:
            self.is_open = False
            raise PreconditionFailed("inequivalent arg 'x-queue-type'", (50, 10), 406)
        self.broker.queues[name] = kwargs["arguments"]

    def close(self) -> None:
        self.is_open = False


class FakeBroker:
    """A publisher and its connection: routes to declared queues, returns the rest."""

    def __init__(self) -> None:
        self.queues: dict[str, dict[str, Any]] = {}
        self.declared: list[tuple[str, dict[str, Any]]] = []
        self.published: list[Any] = []
        self.nack = False
        self.connection = self
        self.channels: list[FakeChannel] = []

    def channel(self) -> FakeChannel:
        channel = FakeChannel(self)
        self.channels.append(channel)
        return channel

    def connect(self) -> None:
        return None

    def exclusive(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def publish_many(self, messages: list[Any]) -> list[bool]:
        self.published.extend(messages)
        return [not self.nack and m.routing_key in self.queues for m in messages]


def parked(queue: str = "orders", delay_ms: int = 300, **headers: Any) -> ParkedMessage:
    return ParkedMessage(
        message_id="m-1",
        attempt=3,
        queue=queue,
        body=b'{"x": 1}',
        headers={"x-dlx-attempt": 3, "x-dlx-queue": queue, **headers},
        properties={"content_type": "application/json", "message_id": "m-1"},
        due_ms=10_000 + delay_ms,
        parked_ms=10_000,
    )


def test_park_declares_the_step_queue_and_publishes_the_message_as_it_is() -> None:
    broker = FakeBroker()
    ladder = Ladder([0.2, 0.5, 1])
    ladder.park(broker, parked(delay_ms=300))  # type: ignore[arg-type]
    [(name, kwargs)] = broker.declared
    assert name == "orders_dlq_0.5"
    assert kwargs == {
        "durable": True,
        "auto_delete": False,
        "arguments": delay_queue_arguments("orders", 500),
    }
    [out] = broker.published
    assert (out.exchange, out.routing_key, out.body) == ("", "orders_dlq_0.5", b'{"x": 1}')
    assert out.headers == {"x-dlx-attempt": 3, "x-dlx-queue": "orders"}
    assert out.properties == {"content_type": "application/json", "message_id": "m-1"}
    assert all(not c.is_open for c in broker.channels)  # the declare channel is closed


def test_a_hot_path_does_not_redeclare_until_the_refresh_time() -> None:
    broker = FakeBroker()
    clock = Clock()
    ladder = Ladder([0.2, 0.5, 1], cache=DeclareCache(refresh=60.0, clock=clock))
    for _ in range(5):
        ladder.park_many(broker, [parked(delay_ms=100), parked(delay_ms=400)])  # type: ignore[arg-type]
    assert [n for n, _ in broker.declared] == ["orders_dlq_0.2", "orders_dlq_0.5"]
    clock.now += 61
    ladder.park(broker, parked(delay_ms=100))  # type: ignore[arg-type]
    assert [n for n, _ in broker.declared][-1] == "orders_dlq_0.2"
    assert len(broker.declared) == 3
    assert len(broker.published) == 11


def test_a_vanished_delay_queue_is_declared_again_and_the_publish_retried() -> None:
    broker = FakeBroker()
    ladder = Ladder([0.2, 0.5, 1])
    ladder.park(broker, parked())  # type: ignore[arg-type]
    del broker.queues["orders_dlq_0.5"]  # expired or deleted while the cache trusted it
    ladder.park(broker, parked())  # type: ignore[arg-type]
    assert [n for n, _ in broker.declared] == ["orders_dlq_0.5", "orders_dlq_0.5"]
    assert [m.routing_key for m in broker.published] == ["orders_dlq_0.5"] * 3


def test_a_publish_the_broker_keeps_refusing_raises() -> None:
    broker = FakeBroker()
    broker.nack = True
    with pytest.raises(PublishError, match=r"orders_dlq_0\.5"):
        Ladder([0.2, 0.5, 1]).park(broker, parked())  # type: ignore[arg-type]


def test_a_delay_queue_with_other_arguments_is_a_topology_error_naming_the_setting() -> None:
    broker = FakeBroker()
    broker.queues["orders_dlq_0.5"] = delay_queue_arguments("orders", 500, quorum=True)
    with pytest.raises(TopologyError) as err:
        Ladder([0.2, 0.5, 1]).park(broker, parked())  # type: ignore[arg-type]
    message = str(err.value)
    assert "orders_dlq_0.5" in message and "dlx_quorum" in message and "x-expires" in message
    assert message.endswith(f"See {doc_url('delays')}")
    assert broker.published == []


def test_quorum_ladder_declares_quorum_delay_queues() -> None:
    broker = FakeBroker()
    Ladder([1], quorum=True).park(broker, parked(delay_ms=1000))  # type: ignore[arg-type]
    assert broker.queues["orders_dlq_1"]["x-queue-type"] == "quorum"


def test_a_delay_past_the_last_step_waits_the_last_step_and_says_so_once_per_queue(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = FakeBroker()
    ladder = Ladder([0.2, 0.5, 1])
    with caplog.at_level(logging.WARNING, logger="celery_dlx.broker.ladder"):
        for delay in (5000, 7000, 9000):
            ladder.park(broker, parked(delay_ms=delay))  # type: ignore[arg-type]
        ladder.park(broker, parked(queue="other", delay_ms=2000))  # type: ignore[arg-type]
    assert {m.routing_key for m in broker.published} == {"orders_dlq_1", "other_dlq_1"}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "queue orders" in lines[0] and "dlx_ttl_ladder" in lines[0] and "5.000s" in lines[0]
    assert "queue other" in lines[1]


def test_ladder_rejects_an_unusable_setting() -> None:
    with pytest.raises(ConfigurationError, match="dlx_ttl_ladder"):
        Ladder([0.0001])


# --- Runtime with the ttl backend ------------------------------------------------------------


class DownRedis:
    """A Redis client whose server is down."""

    def pipeline(self, transaction: bool = True) -> Any:
        return self

    def xadd(self, *args: Any, **kwargs: Any) -> None:
        return None

    def hincrby(self, *args: Any) -> None:
        return None

    def expire(self, *args: Any) -> None:
        return None

    def set(self, *args: Any, **kwargs: Any) -> None:  # a retry's marker
        return None

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6399. Connection refused.")


def runtime_with(backend: str) -> Runtime:
    runtime = Runtime(object(), load_config({"dlx_delay_backend": backend}))
    runtime._pid = os.getpid()
    runtime._redis = DownRedis()
    return runtime


def event() -> FateEvent:
    return FateEvent.from_fields(
        fate=PARKED, queue="orders", message_id="m-1", attempt=1, delay=0.5
    )


def test_with_ttl_a_history_outage_does_not_fail_the_fate_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = runtime_with("ttl")
    seen: list[FateEvent] = []
    runtime.listeners.append(seen.append)
    with caplog.at_level(logging.WARNING, logger="celery_dlx"):
        for _ in range(3):
            runtime.record(event())
    assert len(seen) == 3  # listeners (Flower, Sentry) still hear of every fate
    outage = [r for r in caplog.records if "failure history" in r.getMessage()]
    assert len(outage) == 1 and "dlx_redis_url" in outage[0].getMessage()


def test_with_redis_a_history_outage_is_part_of_the_fate() -> None:
    with pytest.raises(redis.ConnectionError):
        runtime_with("redis").record(event())


def test_runtime_parks_through_the_ladder_without_touching_redis() -> None:
    runtime = Runtime(
        object(), load_config({"dlx_delay_backend": "ttl", "dlx_ttl_ladder": [0.2, 0.5]})
    )
    runtime._pid = os.getpid()
    broker = FakeBroker()
    runtime._publisher = broker  # type: ignore[assignment]
    runtime._redis = object()  # any use would fail
    assert runtime.park(parked(delay_ms=300)) is True
    assert [m.routing_key for m in broker.published] == ["orders_dlq_0.5"]
