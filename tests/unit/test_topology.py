"""Kombu builders for dead-lettering; declaration order checked on a recording fake channel."""

from __future__ import annotations

import copy
from typing import Any
from unittest.mock import MagicMock

import pytest
from amqp.exceptions import PreconditionFailed
from kombu import Exchange, Queue, binding
from kombu.transport.base import to_rabbitmq_queue_arguments

from celery_dlx.broker.management import ManagementError
from celery_dlx.broker.topology import (
    DLXQueue,
    app_reference,
    as_dlx_queue,
    dead_letter_arguments,
    declare_topology,
    dlx_exchange,
    dlx_queue,
    migration_hint,
    policy_name,
    service_queue,
)
from celery_dlx.docs_url import doc_url
from celery_dlx.errors import ConfigurationError, TopologyError

QUORUM = {
    "x-queue-type": "quorum",
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
}


# --- dead_letter_arguments -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, {"x-dead-letter-exchange": "celery_dlx", "x-dead-letter-routing-key": "work"}),
        (
            {"exchange": "proj_dlx"},
            {"x-dead-letter-exchange": "proj_dlx", "x-dead-letter-routing-key": "work"},
        ),
        (
            {"quorum": True},
            {"x-dead-letter-exchange": "celery_dlx", "x-dead-letter-routing-key": "work", **QUORUM},
        ),
        (
            {"quorum": True, "delivery_limit": 20},
            {
                "x-dead-letter-exchange": "celery_dlx",
                "x-dead-letter-routing-key": "work",
                "x-delivery-limit": 20,
                **QUORUM,
            },
        ),
        (
            {"quorum": True, "delivery_limit": 1},
            {
                "x-dead-letter-exchange": "celery_dlx",
                "x-dead-letter-routing-key": "work",
                "x-delivery-limit": 1,
                **QUORUM,
            },
        ),
    ],
)
def test_dead_letter_arguments(kwargs: dict[str, Any], expected: dict[str, Any]) -> None:
    assert dead_letter_arguments("work", **kwargs) == expected


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("work",), {"delivery_limit": 5}, "x-delivery-limit needs a quorum queue"),
        (("work",), {"quorum": True, "delivery_limit": 0}, "delivery_limit must be >= 1, got 0"),
        (("work",), {"quorum": True, "delivery_limit": -3}, "delivery_limit must be >= 1, got -3"),
        (("",), {}, "queue name must not be empty"),
        (("work", ""), {}, "dead-letter exchange name must not be empty"),
    ],
)
def test_dead_letter_arguments_rejects(
    args: tuple[str, ...], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        dead_letter_arguments(*args, **kwargs)


# --- exchange and service queue ------------------------------------------------------------------


def test_dlx_exchange_is_a_durable_topic() -> None:
    exchange = dlx_exchange("proj_dlx")
    assert (exchange.name, exchange.type, exchange.durable, exchange.auto_delete) == (
        "proj_dlx",
        "topic",
        True,
        False,
    )
    assert dlx_exchange().name == "celery_dlx"


@pytest.mark.parametrize(
    ("quorum", "arguments"), [(False, None), (True, {"x-queue-type": "quorum"})]
)
def test_service_queue_takes_every_dead_letter(quorum: bool, arguments: Any) -> None:
    queue = service_queue("dead", "proj_dlx", quorum=quorum)
    assert (queue.name, queue.routing_key, queue.durable, queue.auto_delete) == (
        "dead",
        "#",
        True,
        False,
    )
    assert queue.exchange == dlx_exchange("proj_dlx")
    assert queue.queue_arguments == arguments


# --- dlx_queue -----------------------------------------------------------------------------------


def test_dlx_queue_defaults_like_celery() -> None:
    queue = dlx_queue("work")
    assert isinstance(queue, DLXQueue)
    assert queue.exchange == Exchange("work", type="direct")
    assert (queue.routing_key, queue.durable) == ("work", True)
    assert queue.queue_arguments == dead_letter_arguments("work")
    assert (queue.dlx_service_queue, queue.dlx_quorum_service) == ("celery_dlx.dead", False)


@pytest.mark.parametrize(
    ("exchange", "routing_key", "expected_exchange", "expected_key"),
    [
        ("events", None, Exchange("events", type="direct"), "work"),
        ("", None, Exchange(""), "work"),
        (
            Exchange("events", type="topic"),
            "billing.#",
            Exchange("events", type="topic"),
            "billing.#",
        ),
        (None, "other", Exchange("work", type="direct"), "other"),
    ],
)
def test_dlx_queue_binding(
    exchange: Any, routing_key: str | None, expected_exchange: Exchange, expected_key: str
) -> None:
    queue = dlx_queue("work", exchange, routing_key)
    assert queue.exchange == expected_exchange
    assert queue.routing_key == expected_key


def test_dlx_queue_options() -> None:
    queue = dlx_queue(
        "work",
        dlx="proj_dlx",
        service="proj.dead",
        quorum=True,
        delivery_limit=10,
        queue_arguments={"x-max-length": 1000, "x-dead-letter-exchange": "proj_dlx"},
        durable=False,
        max_priority=5,
    )
    assert queue.queue_arguments == {
        "x-max-length": 1000,
        **dead_letter_arguments("work", "proj_dlx", quorum=True, delivery_limit=10),
    }
    assert (queue.durable, queue.max_priority) == (False, 5)
    assert (queue.dlx_service_queue, queue.dlx_quorum_service) == ("proj.dead", True)


def test_dlx_queue_rejects_another_dead_letter_exchange() -> None:
    with pytest.raises(ConfigurationError) as info:
        dlx_queue("work", queue_arguments={"x-dead-letter-exchange": "legacy"})
    assert str(info.value) == (
        "queue 'work' sets x-dead-letter-exchange='legacy'; celery_dlx routes dead letters to "
        "'celery_dlx' (dlx_exchange). Remove the argument or set dlx_exchange='legacy'."
    )


def test_dlx_queue_copies_keep_the_service_queue() -> None:
    """Kombu binds (and Celery maps) queues by copying them through ``attrs``."""
    queue = dlx_queue("work", dlx="proj_dlx", service="proj.dead", quorum=True)
    for twin in (copy.copy(queue), queue(MagicMock()), queue.bind(MagicMock())):
        assert isinstance(twin, DLXQueue)
        assert twin is not queue
        assert (twin.dlx_service_queue, twin.dlx_quorum_service) == ("proj.dead", True)
        assert twin.queue_arguments == queue.queue_arguments
    assert queue.as_dict()["dlx_service_queue"] == "proj.dead"


# --- as_dlx_queue --------------------------------------------------------------------------------


def test_as_dlx_queue_keeps_exchange_bindings_and_options() -> None:
    events = Exchange("events", type="topic")
    original = Queue(
        "billing",
        exchange=events,
        routing_key="billing.*",
        bindings=[binding(events, routing_key="invoice.#"), binding(Exchange("audit"), "all")],
        queue_arguments={"x-max-length": 10},
        consumer_arguments={"x-priority": 3},
        binding_arguments={"x-match": "all"},
        alias="bills",
        max_priority=7,
        message_ttl=60,
        expires=3600,
        max_length_bytes=1 << 20,
    )
    queue = as_dlx_queue(original, dlx="proj_dlx", service="proj.dead")
    assert isinstance(queue, DLXQueue)
    assert (queue.name, queue.routing_key) == ("billing", "billing.*")
    # kombu keeps either an exchange or explicit bindings; both must carry over.
    assert queue.exchange == original.exchange
    assert queue.bindings == original.bindings
    assert as_dlx_queue(Queue("billing", exchange=events, routing_key="b.*")).exchange == events
    assert queue.queue_arguments == {
        "x-max-length": 10,
        **dead_letter_arguments("billing", "proj_dlx"),
    }
    for attr in (
        "durable",
        "consumer_arguments",
        "binding_arguments",
        "alias",
        "max_priority",
        "message_ttl",
        "expires",
        "max_length_bytes",
        "no_declare",
    ):
        assert getattr(queue, attr) == getattr(original, attr), attr
    assert queue.dlx_service_queue == "proj.dead"
    assert original.queue_arguments == {"x-max-length": 10}  # the original is not changed


@pytest.mark.parametrize(
    "original",
    [
        Queue("reply", exclusive=True),
        Queue("tmp", auto_delete=True),
        Queue("legacy", queue_arguments={"x-dead-letter-exchange": "legacy_dlx"}),
        dlx_queue("already", dlx="other_dlx"),
    ],
    ids=["exclusive", "auto-delete", "own-dlx", "dlx-queue"],
)
def test_as_dlx_queue_leaves_some_queues_alone(original: Queue) -> None:
    before = dict(original.queue_arguments or {})
    assert as_dlx_queue(original) is original
    assert dict(original.queue_arguments or {}) == before


def test_as_dlx_queue_accepts_its_own_dead_letter_exchange() -> None:
    original = Queue("work", queue_arguments={"x-dead-letter-exchange": "celery_dlx"})
    assert as_dlx_queue(original).queue_arguments == dead_letter_arguments("work")


@pytest.mark.parametrize(
    ("original", "kwargs", "expected"),
    [
        (Queue("q"), {"quorum": True}, dead_letter_arguments("q", quorum=True)),
        (
            Queue("q", queue_arguments={"x-queue-type": "quorum"}),
            {},
            dead_letter_arguments("q", quorum=True),
        ),
        (
            Queue("q", queue_arguments={"x-queue-type": "quorum"}),
            {"delivery_limit": 3},
            dead_letter_arguments("q", quorum=True, delivery_limit=3),
        ),
    ],
)
def test_as_dlx_queue_quorum(original: Queue, kwargs: dict[str, Any], expected: Any) -> None:
    assert as_dlx_queue(original, **kwargs).queue_arguments == expected


# --- declaration order on a recording channel -----------------------------------------------


def recording_channel(refuse: str | None = None) -> MagicMock:
    """A fake channel; ``queue_declare`` of ``refuse`` answers 406 like RabbitMQ."""
    channel = MagicMock(name="channel")
    channel.prepare_queue_arguments.side_effect = to_rabbitmq_queue_arguments

    def queue_declare(queue: str, **kwargs: Any) -> tuple[str, int, int]:
        if queue == refuse:
            raise PreconditionFailed(
                "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange'"
            )
        return (queue, 0, 0)

    channel.queue_declare.side_effect = queue_declare
    return channel


def declared_queues(channel: MagicMock) -> list[tuple[str, Any]]:
    return [
        (c.kwargs["queue"], c.kwargs.get("arguments")) for c in channel.queue_declare.call_args_list
    ]


def test_dlx_queue_declares_its_dead_letter_target_first() -> None:
    channel = recording_channel()
    queue = dlx_queue("work", dlx="proj_dlx", service="proj.dead")(channel)
    assert queue.declare() == "work"
    assert declared_queues(channel) == [("proj.dead", {}), ("work", queue.queue_arguments)]
    exchanges = [c.kwargs["exchange"] for c in channel.exchange_declare.call_args_list]
    assert exchanges.index("proj_dlx") < exchanges.index("work")
    bindings = [
        (c.kwargs["queue"], c.kwargs["exchange"]) for c in channel.queue_bind.call_args_list
    ]
    assert bindings[0] == ("proj.dead", "proj_dlx")


def test_dlx_queue_406_becomes_a_topology_error_with_a_migration_hint() -> None:
    queue = dlx_queue("work")(recording_channel(refuse="work"))
    with pytest.raises(TopologyError) as info:
        queue.declare()
    message = str(info.value)
    assert "queue 'work' already exists with other arguments" in message
    assert "celery -A proj dlx migrate work --policy" in message
    assert "set_policy -p / celery-dlx-work '^work$'" in message, "the policy name migrate writes"
    assert message.endswith(f"See {doc_url('migration')}"), "the page by URL: no docs/ in a wheel"
    assert isinstance(info.value.__cause__, PreconditionFailed)


def test_the_406_error_names_the_real_app() -> None:
    queue = dlx_queue("work")
    queue.dlx_app = "shop.celery"
    with pytest.raises(TopologyError) as info:
        queue(recording_channel(refuse="work")).declare()
    assert "celery -A shop.celery dlx migrate work --policy" in str(info.value)
    assert "celery -A shop.celery dlx migrate work --rename" in str(info.value)


@pytest.mark.parametrize(
    ("argv", "main", "expected"),
    [
        (["celery", "-A", "proj.app", "worker"], "other", "proj.app"),
        (["celery", "--app", "billing", "worker"], None, "billing"),
        (["celery", "--app=billing.c", "worker"], None, "billing.c"),
        (["celery", "-Ashop", "worker"], None, "shop"),
        (["python", "run.py"], "shop", "shop"),
        (["python", "run.py"], "__main__", "proj"),
        (["python", "run.py"], None, "proj"),
    ],
)
def test_app_reference_is_the_a_value_else_the_apps_name(
    argv: list[str], main: str | None, expected: str
) -> None:
    assert app_reference(main, argv) == expected


def test_migrate_and_the_error_name_the_same_policy() -> None:
    from celery_dlx.ops import migrate

    assert migrate.policy_name("orders") == policy_name("orders") == "celery-dlx-orders"
    assert f"set_policy -p / {policy_name('orders')} " in migration_hint("orders", "celery_dlx")


def test_the_rabbitmqctl_line_names_the_virtual_host() -> None:
    hint = migration_hint("orders", "celery_dlx", vhost="shop")
    assert "rabbitmqctl set_policy -p shop celery-dlx-orders '^orders$' " in hint
    assert "set_policy -p 'my shop' " in migration_hint("orders", "x", vhost="my shop")


def test_no_declare_queue_declares_nothing() -> None:
    channel = recording_channel()
    assert dlx_queue("work", no_declare=True)(channel).declare() == "work"
    assert channel.method_calls == []


def test_declare_topology_order() -> None:
    channel = recording_channel()
    names = declare_topology(
        channel,
        [dlx_queue("a", dlx="proj_dlx", service="proj.dead"), Queue("b")],
        exchange="proj_dlx",
        service="proj.dead",
    )
    assert names == ["proj.dead", "a", "b"]
    assert declared_queues(channel)[0][0] == "proj.dead"


def test_declare_topology_406_names_the_queue() -> None:
    with pytest.raises(TopologyError, match="queue 'b' already exists"):
        declare_topology(recording_channel(refuse="b"), [Queue("a"), Queue("b")])


# --- a queue migrated by policy (celery dlx migrate QUEUE --policy) ----------------------------


class FakeManagement:
    """The management API's view of one queue, or an unreachable API."""

    def __init__(self, info: dict[str, Any] | None = None, error: Exception | None = None) -> None:
        self.info, self.error = info, error

    def queue(self, name: str) -> dict[str, Any] | None:
        if self.error is not None:
            raise self.error
        return self.info


@pytest.fixture
def refused_with_arguments(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """A RabbitMQ channel on which the queue exists without dead-letter arguments: the probe
    with them answers 406, the probe without them succeeds."""
    from celery_dlx.broker import topology

    probes: list[dict[str, Any]] = []

    def probe(channel: Any, queue: Any, arguments: Any) -> bool:
        probes.append(dict(arguments))
        return "x-dead-letter-exchange" not in arguments

    monkeypatch.setattr(topology, "_is_amqp", lambda channel: True)
    monkeypatch.setattr(topology, "_probe", probe)
    return probes


def _migrated(api: Any) -> Any:
    queue = dlx_queue("orders", dlx="proj_dlx", service="proj.dead")
    queue.dlx_app, queue.dlx_management = "shop", api
    return queue


def test_a_queue_whose_policy_gives_the_dlx_is_declared_as_it_is(
    refused_with_arguments: list[dict[str, Any]],
) -> None:
    api = FakeManagement(
        {
            "arguments": {},
            "policy": "celery-dlx-orders",
            "effective_policy_definition": {"dead-letter-exchange": "proj_dlx"},
        }
    )
    channel = recording_channel()
    assert _migrated(api)(channel).declare() == "orders"
    assert declared_queues(channel) == [("proj.dead", {}), ("orders", {})]
    assert [("x-dead-letter-exchange" in p) for p in refused_with_arguments] == [True, False]


@pytest.mark.parametrize(
    ("api", "expected"),
    [
        (FakeManagement({"arguments": {}}), "its dead letters go nowhere"),
        (
            FakeManagement(
                {"policy": "other", "effective_policy_definition": {"dead-letter-exchange": "x"}}
            ),
            "its dead letters go to 'x' by policy",
        ),
        (
            FakeManagement(error=ManagementError("connection refused")),
            "the management API could not say whether a policy covers it (connection refused)",
        ),
        (None, "celery -A shop dlx migrate orders --policy"),
    ],
)
def test_without_a_matching_policy_the_406_is_refused_with_the_hint(
    refused_with_arguments: list[dict[str, Any]], api: Any, expected: str
) -> None:
    channel = recording_channel()
    with pytest.raises(TopologyError) as info:
        _migrated(api)(channel).declare()
    message = str(info.value)
    assert expected in message
    assert "set_policy -p / celery-dlx-orders '^orders$'" in message
    assert declared_queues(channel) == [("proj.dead", {})], "the caller's channel declared nothing"


def test_a_dlx_queue_reports_kombus_fields_only_and_copies_keep_its_own() -> None:
    """``celery inspect active_queues`` sends ``as_dict(recurse=True)`` as JSON: no management
    client or app name in it; a bound copy keeps them."""
    from copy import copy

    from kombu.utils.json import dumps

    from celery_dlx.broker.topology import DLXQueue

    queue = DLXQueue("q", dlx_service_queue="dead", dlx_app="proj", dlx_management=object())
    report = queue.as_dict(recurse=True)
    assert not [k for k in report if k.startswith("dlx_")]
    dumps(report)
    twin = copy(queue)
    assert (twin.dlx_service_queue, twin.dlx_app) == ("dead", "proj")
    assert twin.dlx_management is queue.dlx_management


def test_a_queue_left_on_the_exchange_of_earlier_versions_says_how_to_keep_it(
    refused_with_arguments: list[dict[str, Any]],
) -> None:
    # An app with dlx_key_prefix = "shop" whose queue still dead-letters to celery_dlx by argument.
    queue = dlx_queue("orders", dlx="celery_dlx.shop", service="celery_dlx.shop.dead")
    queue.dlx_app = "shop"
    queue.dlx_management = FakeManagement(
        {"arguments": {"x-dead-letter-exchange": "celery_dlx"}, "durable": True}
    )
    with pytest.raises(TopologyError) as info:
        queue(recording_channel()).declare()
    message = str(info.value)
    assert (
        "its dead letters go to 'celery_dlx' by argument (the exchange of earlier versions"
        in message
    )
    assert "set dlx_exchange = 'celery_dlx' and dlx_service_queue = 'celery_dlx.dead'" in message
    # A queue of another exchange altogether gets no such note.
    other = _migrated(FakeManagement({"arguments": {"x-dead-letter-exchange": "celery_dlx"}}))
    with pytest.raises(TopologyError) as info:
        other(recording_channel()).declare()
    assert "earlier versions" not in str(info.value)
