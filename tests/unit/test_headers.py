"""Pure header functions: own attempt headers, broker header stripping, x-death, identities."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any

import pytest

from celery_dlx.errors import MalformedHeader
from celery_dlx.message.headers import (
    DLXState,
    HistoryEntry,
    clean_headers,
    exception_type_name,
    fingerprint,
    is_broker_header,
    message_identity,
    normalize_message,
    parse_x_death,
    read_state,
    state_headers,
    x_death_problem,
)
from celery_dlx.message.names import (
    ATTEMPT_HEADER,
    CAUSE_HEADER,
    DELIVERY_QUEUE_HEADER,
    EXC_MESSAGE_HEADER,
    EXC_MESSAGE_LIMIT,
    EXC_TYPE_HEADER,
    FIRST_FAILURE_HEADER,
    HISTORY_HEADER,
    HISTORY_LIMIT,
    PARKS_HEADER,
    QUEUE_HEADER,
    REQUEUES_HEADER,
)

AT_MS = 1_700_000_000_000
WHEN = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)

FULL_STATE = DLXState(
    attempt=3,
    requeues=2,
    parks=1,
    history=(
        HistoryEntry(AT_MS, "requeued", "c1"),
        HistoryEntry(AT_MS + 10, "requeued", "c1"),
        HistoryEntry(AT_MS + 20, "parked", "c2"),
    ),
    queue="billing",
    first_failure_ms=AT_MS,
    cause="c2",
    exc_type="billing.errors.Timeout",
    exc_message="gateway timed out after 30s",
)


# --- own headers: read_state / state_headers ---------------------------------------------------


@pytest.mark.parametrize("headers", [None, {}, {"id": "abc", "task": "proj.add"}])
def test_read_state_without_own_headers_is_a_first_delivery(headers: Any) -> None:
    assert read_state(headers) == DLXState()


@pytest.mark.parametrize("name", sorted(state_headers(FULL_STATE)))
def test_read_state_reads_each_own_header_even_alone(name: str) -> None:
    # A table with none of celery_dlx's headers is read as the empty state without looking
    # further: each of them, alone, must still be read as with another one beside it.
    value = state_headers(FULL_STATE)[name]
    other = REQUEUES_HEADER if name == ATTEMPT_HEADER else ATTEMPT_HEADER
    alone = read_state({"id": "abc", name: value})
    assert alone != DLXState()
    assert alone == read_state({"id": "abc", name: value, other: 0})


@pytest.mark.parametrize(
    "state",
    [
        DLXState(),
        DLXState(attempt=1, requeues=1, history=(HistoryEntry(AT_MS, "requeued", ""),)),
        FULL_STATE,
        DLXState(attempt=4, exc_message="quote ' \" and unicode \u00e9\u2603"),
    ],
)
def test_state_headers_round_trip(state: DLXState) -> None:
    assert read_state(state_headers(state)) == state


def test_state_headers_are_plain_strings_and_integers() -> None:
    headers = state_headers(FULL_STATE)
    assert headers == {
        ATTEMPT_HEADER: 3,
        REQUEUES_HEADER: 2,
        PARKS_HEADER: 1,
        HISTORY_HEADER: (
            f'[[{AT_MS},"requeued","c1"],'
            f'[{AT_MS + 10},"requeued","c1"],'
            f'[{AT_MS + 20},"parked","c2"]]'
        ),
        QUEUE_HEADER: "billing",
        FIRST_FAILURE_HEADER: AT_MS,
        CAUSE_HEADER: "c2",
        EXC_TYPE_HEADER: "billing.errors.Timeout",
        EXC_MESSAGE_HEADER: "gateway timed out after 30s",
    }


def test_state_headers_omit_unknown_fields() -> None:
    assert set(state_headers(DLXState())) == {
        ATTEMPT_HEADER,
        REQUEUES_HEADER,
        PARKS_HEADER,
        HISTORY_HEADER,
    }


def test_read_state_accepts_bytes_values_as_other_clients_send_them() -> None:
    headers = {
        ATTEMPT_HEADER: b"3",
        REQUEUES_HEADER: "2",
        PARKS_HEADER: 1,
        HISTORY_HEADER: json.dumps([[AT_MS, "parked", "c"]]).encode(),
        QUEUE_HEADER: b"billing",
        FIRST_FAILURE_HEADER: str(AT_MS).encode(),
        CAUSE_HEADER: b"c",
        EXC_TYPE_HEADER: b"ValueError",
        EXC_MESSAGE_HEADER: "bad \u00e9".encode(),
    }
    assert read_state(headers) == DLXState(
        attempt=3,
        requeues=2,
        parks=1,
        history=(HistoryEntry(AT_MS, "parked", "c"),),
        queue="billing",
        first_failure_ms=AT_MS,
        cause="c",
        exc_type="ValueError",
        exc_message="bad \u00e9",
    )


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({ATTEMPT_HEADER: "abc"}, "header x-dlx-attempt must be a non-negative integer, got 'abc'"),
        ({ATTEMPT_HEADER: -1}, "header x-dlx-attempt must be a non-negative integer, got -1"),
        (
            {REQUEUES_HEADER: True},
            "header x-dlx-requeues must be a non-negative integer, got a boolean",
        ),
        ({PARKS_HEADER: [1]}, "header x-dlx-parks must be a non-negative integer, got [1]"),
        (
            {PARKS_HEADER: float("inf")},
            "header x-dlx-parks must be a non-negative integer, got inf",
        ),
        ({PARKS_HEADER: b"\xff"}, "header x-dlx-parks must be a non-negative integer"),
        (
            {FIRST_FAILURE_HEADER: "yesterday"},
            "header x-dlx-first-failure-ms must be a non-negative",
        ),
        ({HISTORY_HEADER: "not json"}, "header x-dlx-history is not JSON: 'not json'"),
        ({HISTORY_HEADER: b"[[1,"}, "header x-dlx-history is not JSON"),
        ({HISTORY_HEADER: "{}"}, "header x-dlx-history must be a JSON list"),
        ({HISTORY_HEADER: "[[1, 2]]"}, "header x-dlx-history has a bad entry: [1, 2]"),
        ({HISTORY_HEADER: '[[1, "parked", 3]]'}, "header x-dlx-history has a bad entry"),
        ({HISTORY_HEADER: '[["1", "parked", ""]]'}, "header x-dlx-history has a bad entry"),
        ({HISTORY_HEADER: '["x"]'}, "header x-dlx-history has a bad entry: 'x'"),
        ({HISTORY_HEADER: "[" * 100_000 + "]" * 100_000}, "header x-dlx-history is not JSON"),
    ],
)
def test_read_state_rejects_malformed_own_headers(headers: dict[str, Any], message: str) -> None:
    with pytest.raises(MalformedHeader) as info:
        read_state(headers)
    assert str(info.value).startswith(message)


# --- after_failure ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fate", "requeues", "parks"), [("requeued", 3, 1), ("parked", 2, 2), ("drained", 2, 1)]
)
def test_after_failure_counts_the_fate(fate: str, requeues: int, parks: int) -> None:
    after = FULL_STATE.after_failure(fate=fate, at_ms=AT_MS + 99, cause="c3", queue=None)
    assert (after.attempt, after.requeues, after.parks) == (4, requeues, parks)
    assert after.history == (*FULL_STATE.history, HistoryEntry(AT_MS + 99, fate, "c3"))


def test_after_failure_from_a_first_delivery() -> None:
    after = DLXState().after_failure(
        fate="requeued",
        at_ms=AT_MS,
        cause="c",
        queue="work",
        exc_type="ValueError",
        exc_message="bad",
    )
    assert after == DLXState(
        attempt=1,
        requeues=1,
        parks=0,
        history=(HistoryEntry(AT_MS, "requeued", "c"),),
        queue="work",
        first_failure_ms=AT_MS,
        cause="c",
        exc_type="ValueError",
        exc_message="bad",
    )


def test_after_failure_keeps_first_failure_and_replaces_the_last_cause() -> None:
    after = FULL_STATE.after_failure(
        fate="parked", at_ms=AT_MS + 500, cause="new", queue="other", exc_type="KeyError"
    )
    assert after.first_failure_ms == AT_MS
    assert (after.queue, after.cause, after.exc_type, after.exc_message) == (
        "other",
        "new",
        "KeyError",
        None,
    )
    assert FULL_STATE.after_failure(fate="parked", at_ms=1, cause="", queue=None).queue == "billing"


def test_after_failure_truncates_the_exception_message() -> None:
    after = DLXState().after_failure(
        fate="parked", at_ms=AT_MS, cause="c", queue="q", exc_message="x" * (EXC_MESSAGE_LIMIT * 3)
    )
    assert after.exc_message == "x" * EXC_MESSAGE_LIMIT


def test_after_failure_caps_the_history_keeping_the_newest() -> None:
    state = DLXState()
    runs = HISTORY_LIMIT + 7
    for i in range(runs):
        state = state.after_failure(fate="requeued", at_ms=AT_MS + i, cause=f"c{i}", queue="q")
    assert state.attempt == runs
    assert len(state.history) == HISTORY_LIMIT
    assert [e.at_ms for e in state.history] == [AT_MS + i for i in range(7, runs)]
    assert read_state(state_headers(state)) == state


# --- clean_headers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "broker_owned"),
    [
        ("x-death", True),
        ("x-first-death-queue", True),
        ("x-first-death-reason", True),
        ("x-first-death-exchange", True),
        ("x-last-death-queue", True),
        ("x-last-death-reason", True),
        ("x-last-death-exchange", True),
        ("x-delivery-count", True),
        (DELIVERY_QUEUE_HEADER, True),
        ("id", False),
        ("task", False),
        ("retries", False),
        ("x-dlx-attempt", False),
        ("x-tenant", False),
        ("x-deadline", False),
        ("death", False),
    ],
)
def test_is_broker_header(name: str, broker_owned: bool) -> None:
    assert is_broker_header(name) is broker_owned


BROKER_HEADERS = {
    "x-death": [{"queue": "q", "reason": "rejected", "count": 1}],
    "x-first-death-queue": "q",
    "x-first-death-reason": "rejected",
    "x-first-death-exchange": "",
    "x-last-death-queue": "q",
    "x-last-death-reason": "rejected",
    "x-last-death-exchange": "",
    "x-delivery-count": 3,
    DELIVERY_QUEUE_HEADER: "q",
}
APP_HEADERS = {"id": "t-1", "task": "proj.add", "retries": 0, "x-tenant": "acme"}


def test_clean_headers_strips_broker_headers_and_keeps_the_rest() -> None:
    headers = {**BROKER_HEADERS, **APP_HEADERS, ATTEMPT_HEADER: 1}
    assert clean_headers(headers) == {**APP_HEADERS, ATTEMPT_HEADER: 1}
    assert ATTEMPT_HEADER in headers and "x-death" in headers  # the input is left alone


def test_clean_headers_writes_the_state_over_old_own_headers() -> None:
    old = state_headers(DLXState(attempt=1, requeues=1, cause="old", exc_message="old message"))
    cleaned = clean_headers({**BROKER_HEADERS, **APP_HEADERS, **old}, FULL_STATE)
    assert cleaned == {**APP_HEADERS, **state_headers(FULL_STATE)}


@pytest.mark.parametrize("headers", [None, {}])
def test_clean_headers_of_nothing(headers: Any) -> None:
    assert clean_headers(headers) == {}
    assert clean_headers(headers, DLXState()) == state_headers(DLXState())


# --- parse_x_death ---------------------------------------------------------------------------


def rabbit_death(**overrides: Any) -> dict[str, Any]:
    """One x-death table as RabbitMQ 3.x writes it."""
    table: dict[str, Any] = {
        "count": 2,
        "reason": "rejected",
        "queue": "billing",
        "time": WHEN,
        "exchange": "events",
        "routing-keys": ["billing.created"],
    }
    table.update(overrides)
    return table


@pytest.mark.parametrize("headers", [None, {}, {"id": "x"}])
def test_parse_x_death_absent(headers: Any) -> None:
    assert parse_x_death(headers) == []
    assert x_death_problem(headers) is None


def test_parse_x_death_well_formed_newest_first() -> None:
    headers = {
        "x-death": [
            rabbit_death(),
            rabbit_death(
                reason="expired",
                queue="billing_dlq_10",
                count=1,
                exchange="",
                **{"original-expiration": "10000"},
            ),
        ]
    }
    first, second = parse_x_death(headers)
    assert (first.queue, first.reason, first.count, first.exchange) == (
        "billing",
        "rejected",
        2,
        "events",
    )
    assert first.routing_keys == ("billing.created",)
    assert first.time == WHEN
    assert dict(first.extra) == {
        "time": WHEN,
        "exchange": "events",
        "routing-keys": ["billing.created"],
    }
    assert (second.queue, second.reason, second.count, second.exchange) == (
        "billing_dlq_10",
        "expired",
        1,
        "",
    )
    assert second.extra["original-expiration"] == "10000"
    assert x_death_problem(headers) is None


def test_parse_x_death_bytes_values_as_pika_delivers_them() -> None:
    (death,) = parse_x_death(
        {
            "x-death": (
                {
                    "count": 1,
                    "reason": b"delivery_limit",
                    "queue": b"orders",
                    "exchange": b"amq.topic",
                    "routing-keys": [b"orders.new", b"orders.\xff"],
                    "time": WHEN,
                },
            )
        }
    )
    assert (death.queue, death.reason, death.exchange) == ("orders", "delivery_limit", "amq.topic")
    assert death.routing_keys == ("orders.new", "orders.\ufffd")


@pytest.mark.parametrize(
    ("table", "field", "value"),
    [
        ({"queue": "q", "reason": "maxlen"}, "count", 1),
        ({"queue": "q", "reason": "rejected", "count": 0}, "count", 0),
        ({"queue": "q", "reason": "rejected", "time": "2024-01-02"}, "time", None),
        ({"queue": "q", "reason": "rejected", "routing-keys": None}, "routing_keys", ()),
        ({"queue": "q", "reason": "rejected", "exchange": None}, "exchange", ""),
    ],
)
def test_parse_x_death_optional_fields(table: dict[str, Any], field: str, value: Any) -> None:
    (death,) = parse_x_death({"x-death": [table]})
    assert getattr(death, field) == value


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("rejected", "x-death must be a list of tables, got str"),
        (b"rejected", "x-death must be a list of tables, got bytes"),
        ({"queue": "q", "reason": "rejected"}, "x-death must be a list of tables, got dict"),
        (7, "x-death must be a list of tables, got int"),
        (None, "x-death must be a list of tables, got NoneType"),
        (["q", "rejected"], "x-death[0] must be a table, got str"),
        ([rabbit_death(), b"x"], "x-death[1] must be a table, got bytes"),
        ([[("queue", "q")]], "x-death[0] must be a table, got list"),
        ([{"reason": "rejected", "count": 1}], "x-death[0] has no queue"),
        ([rabbit_death(queue="")], "x-death[0] has no queue"),
        ([rabbit_death(queue=5)], "x-death[0] has no queue"),
        ([rabbit_death(reason="nacked")], "x-death[0] has an unknown reason 'nacked'"),
        ([rabbit_death(reason=None)], "x-death[0] has an unknown reason None"),
        ([rabbit_death(reason=b"gone")], "x-death[0] has an unknown reason b'gone'"),
        ([rabbit_death(count=-1)], "x-death[0] count must be a non-negative integer, got -1"),
        ([rabbit_death(count=True)], "x-death[0] count must be a non-negative integer, got True"),
        ([rabbit_death(count="2")], "x-death[0] count must be a non-negative integer, got '2'"),
        ([rabbit_death(count=1.0)], "x-death[0] count must be a non-negative integer, got 1.0"),
        ([rabbit_death(**{"routing-keys": "k"})], "x-death[0] routing-keys must be a list"),
    ],
)
def test_parse_x_death_malformed(raw: Any, message: str) -> None:
    headers = {"x-death": raw}
    with pytest.raises(MalformedHeader) as info:
        parse_x_death(headers)
    assert str(info.value) == message
    assert x_death_problem(headers) == message


def test_malformed_reason_is_truncated_in_the_message() -> None:
    problem = x_death_problem({"x-death": [rabbit_death(reason="r" * 500)]})
    assert problem is not None and len(problem) < 100


# --- message_identity ------------------------------------------------------------------------

#: The body digest of b"body" with no properties: what a message without a provable id gets.
DIGEST = "sha1-" + __import__("hashlib").sha1(b"body").hexdigest()


@pytest.mark.parametrize(
    ("properties", "headers", "expected"),
    [
        ({"message_id": "m", "correlation_id": "c"}, {"id": "t", "task": "a"}, "m"),
        ({"correlation_id": "c"}, {"id": "t", "task": "a"}, "t"),
        ({"message_id": b"m-bytes"}, None, "m-bytes"),
        ({"message_id": 12}, {"id": "t", "task": "a"}, "t"),
        (None, {"id": b"t-bytes", "task": b"a"}, "t-bytes"),
        ({}, {"x-dlx-id": "sha1-ab~cd"}, "sha1-ab~cd"),
        ({"message_id": "m"}, {"x-dlx-id": "sha1-ab~cd"}, "m"),
        # Shared by many messages by design (issue 12): never an identity.
        ({"correlation_id": "c"}, {}, DIGEST),
        ({"message_id": "", "correlation_id": "c"}, {"id": ""}, DIGEST),
        # A foreign "id" header is often an entity id: only Celery's (beside "task") counts.
        ({}, {"id": "user-42"}, DIGEST),
        ({"message_id": 12}, {"id": "t"}, DIGEST),
    ],
)
def test_message_identity_precedence(
    properties: dict[str, Any] | None, headers: dict[str, Any] | None, expected: str
) -> None:
    assert message_identity(properties, headers, b"body") == expected


def test_message_identity_digest_is_stable_and_depends_on_body_and_properties() -> None:
    props = {"type": "billing.Created", "app_id": "billing", "timestamp": 1700000000}
    digest = message_identity(props, {}, b"payload")
    assert re.fullmatch(r"sha1-[0-9a-f]{40}", digest)
    assert digest == message_identity(dict(props), None, b"payload")
    others = {
        message_identity(props, {}, b"payload2"),
        message_identity({**props, "type": "billing.Deleted"}, {}, b"payload"),
        message_identity({**props, "app_id": "other"}, {}, b"payload"),
        message_identity({**props, "timestamp": 1700000001}, {}, b"payload"),
        message_identity({}, {}, b"payload"),
    }
    assert digest not in others
    assert len(others) == 5
    # A known value, so the digest cannot silently change between releases.
    assert message_identity(None, None, b"") == "sha1-da39a3ee5e6b4b0d3255bfef95601890afd80709"


# --- fingerprint -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "normalized"),
    [
        ("user 42 not found", "user <n> not found"),
        ("took 1.25s", "took <n>s"),
        ("order 1b4e28ba-2fa1-11d2-883f-0030c4b2e9c1 failed", "order <uuid> failed"),
        ("order 1B4E28BA-2FA1-11D2-883F-0030C4B2E9C1 failed", "order <uuid> failed"),
        ("KeyError: 'abc'", "KeyError: <str>"),
        ('missing "x y"', "missing <str>"),
        ("object at 0x7f3a2b", "object at <hex>"),
        ("token a1b2c3d4e5f6a7b8c9 bad", "token <hex> bad"),
        ("  padded  ", "padded"),
        ("connection refused", "connection refused"),
    ],
)
def test_normalize_message(message: str, normalized: str) -> None:
    assert normalize_message(message) == normalized


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("user 42 not found", "user 1337 not found"),
        (
            "order 1b4e28ba-2fa1-11d2-883f-0030c4b2e9c1",
            "order 6fa459ea-ee8a-3ca4-894e-db77e160355e",
        ),
        ("no such key 'alpha'", "no such key 'beta'"),
        ('bad value "1"', 'bad value "two words"'),
        ("<Foo object at 0x7f00aa>", "<Foo object at 0x7f11bb>"),
        ("timeout after 30.5s", "timeout after 2s"),
        ("request " + "ab" * 10, "request " + "cd" * 12),
        (" trailing ", "trailing"),
    ],
)
def test_fingerprint_groups_messages_differing_only_by_values(a: str, b: str) -> None:
    assert fingerprint("proj.charge", "ValueError", a) == fingerprint(
        "proj.charge", "ValueError", b
    )


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (("proj.charge", "ValueError", "bad"), ("proj.charge", "KeyError", "bad")),
        (("proj.charge", "ValueError", "bad"), ("proj.refund", "ValueError", "bad")),
        (("proj.charge", "ValueError", "bad card"), ("proj.charge", "ValueError", "bad amount")),
        (("billing", "ValueError", "bad"), ("orders", "ValueError", "bad")),
        (("a", "b", ""), ("a\x1fb", "", "")),
    ],
)
def test_fingerprint_separates_causes(
    left: tuple[str, str, str], right: tuple[str, str, str]
) -> None:
    assert fingerprint(*left) != fingerprint(*right)


def test_fingerprint_shape() -> None:
    value = fingerprint("proj.charge", "ValueError", "bad 1")
    assert re.fullmatch(r"[0-9a-f]{16}", value)
    assert value == fingerprint("proj.charge", "ValueError", "bad 2")


def test_fingerprint_reads_only_the_first_part_of_a_long_message() -> None:
    head = "x" * EXC_MESSAGE_LIMIT
    assert fingerprint("t", "E", head + "tail one") == fingerprint("t", "E", head + "other tail")


class LocalError(Exception):
    class Nested(Exception):
        pass


@pytest.mark.parametrize(
    ("exc", "name"),
    [
        (ValueError(), "ValueError"),
        (KeyboardInterrupt(), "KeyboardInterrupt"),
        (MalformedHeader("x"), "celery_dlx.errors.MalformedHeader"),
        (json.JSONDecodeError("m", "d", 0), "json.decoder.JSONDecodeError"),
        (LocalError.Nested(), f"{__name__}.LocalError.Nested"),
    ],
)
def test_exception_type_name(exc: BaseException, name: str) -> None:
    assert exception_type_name(exc) == name
