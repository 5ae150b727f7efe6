"""Which management APIs ``dlx check``/``dlx migrate`` try for a broker or a cluster: one per URL
of the failover list (host, credentials and virtual host of that URL), or the ``--management-url``
values; and the first that answers is used (a fake API: no network here)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from celery import Celery
from kombu import Connection

from celery_dlx.broker.management import (
    Management,
    ManagementError,
    broker_urls,
    first_answering,
    management_candidates,
    management_url_of,
    split_urls,
)

CLUSTER = "amqp://bob:s1@mq1:5672/shop;amqp://ann:s2@mq2:5673/shop;amqps://mq3.internal:5671//"


def test_one_management_url_per_broker_url_of_the_failover_list() -> None:
    apis = management_candidates(Connection(CLUSTER))
    assert [(a.url, a.user, a.password, a.vhost) for a in apis] == [
        ("http://mq1:15672", "bob", "s1", "shop"),
        ("http://mq2:15672", "ann", "s2", "shop"),
        ("https://mq3.internal:15671", "guest", "guest", "/"),
    ]


def test_the_failover_list_as_celery_builds_it() -> None:
    app = Celery(broker="amqp://a:b@h1:5672//;amqp://a:b@h2:5672//", set_as_current=False)
    with app.connection_for_write() as conn:
        assert broker_urls(conn) == ["amqp://a:b@h1:5672//", "amqp://a:b@h2:5672//"]
        assert [a.url for a in management_candidates(conn)] == [
            "http://h1:15672",
            "http://h2:15672",
        ]
    listed = Celery(broker=["amqp://h1//", "amqp://h2//"], set_as_current=False)
    with listed.connection_for_write() as conn:
        assert [a.url for a in management_candidates(conn)] == [
            "http://h1:15672",
            "http://h2:15672",
        ]


def test_a_single_broker_url_gives_what_management_for_gave() -> None:
    (api,) = management_candidates(Connection("amqp://bob:secret@mq.internal:5672/shop"))
    assert (api.url, api.user, api.password, api.vhost) == (
        "http://mq.internal:15672",
        "bob",
        "secret",
        "shop",
    )
    (tls,) = management_candidates(Connection("amqp://mq:5671//", ssl=True), user="admin")
    assert tls.url == "https://mq:15671" and tls.user == "admin"


def test_two_urls_of_one_host_are_one_candidate() -> None:
    apis = management_candidates(Connection("amqp://mq:5672//;amqp://mq:5673//"))
    assert [a.url for a in apis] == ["http://mq:15672"]


def test_ipv6_hosts_are_bracketed() -> None:
    assert management_url_of("amqp://guest:guest@[::1]:5672//") == "http://[::1]:15672"
    assert management_url_of("amqps://h//") == "https://h:15671"


def test_given_urls_win_repeated_or_comma_separated() -> None:
    assert split_urls(("http://a:1, http://b:2", "http://c:3", "http://a:1", " ")) == [
        "http://a:1",
        "http://b:2",
        "http://c:3",
    ]
    assert split_urls("http://a:1,http://b:2") == ["http://a:1", "http://b:2"]
    assert split_urls(None) == [] and split_urls(()) == []
    apis = management_candidates(Connection(CLUSTER), urls=("http://x:1,http://y:2",), password="p")
    assert [(a.url, a.user, a.password, a.vhost) for a in apis] == [
        ("http://x:1", "bob", "p", "shop"),
        ("http://y:2", "bob", "p", "shop"),
    ]


@dataclass(frozen=True)
class FakeAPI(Management):
    """A management API that answers or not (``down``), and records the probes it got."""

    down: bool = False
    calls: list[str] | None = None

    def request(self, method: str, path: str, body: object = None) -> object:
        assert self.calls is not None
        self.calls.append(f"{self.url} {method} {path} timeout={self.timeout}")
        if self.down:
            raise ManagementError(f"management API at {self.url} unreachable (refused)")
        return {"name": self.user}


def test_the_first_api_that_answers_is_used() -> None:
    calls: list[str] = []
    apis = [
        FakeAPI(f"http://n{i}:15672", "guest", "guest", down=i == 0, calls=calls, timeout=30)
        for i in range(3)
    ]
    assert first_answering(apis) is apis[1]
    # Probed in order with a short timeout; the third never asked.
    assert calls == [
        "http://n0:15672 GET /api/whoami timeout=5.0",
        "http://n1:15672 GET /api/whoami timeout=5.0",
    ]


def test_none_answering_names_every_url_tried() -> None:
    apis = [FakeAPI(f"http://n{i}:15672", "g", "g", down=True, calls=[]) for i in range(2)]
    with pytest.raises(ManagementError) as caught:
        first_answering(apis)
    text = str(caught.value)
    assert "none of 2 management APIs answered" in text
    assert "http://n0:15672" in text and "http://n1:15672" in text and "--management-url" in text


def test_a_single_candidate_is_not_probed() -> None:
    calls: list[str] = []
    only = FakeAPI("http://n0:15672", "g", "g", down=True, calls=calls)
    assert first_answering([only]) is only and calls == []
    with pytest.raises(ValueError):
        first_answering([])
