"""The DLX service's pure part: reading a dead letter and deciding its fate (no I/O)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_dlx.message.cause import CauseRecord
from celery_dlx.message.headers import DLXState, HistoryEntry, fingerprint, state_headers
from celery_dlx.message.names import (
    ATTEMPT_HEADER,
    DELAY_HEADER,
    FATE_HEADER,
    QUEUE_HEADER,
    REASON_HEADER,
    REPLAYED_HEADER,
)
from celery_dlx.policy.config import load_config
from celery_dlx.policy.deadletter import EXPIRED_CAUSE, PUBLISHED, UNKNOWN, read_dead_letter
from celery_dlx.policy.verdicts import (
    UNKNOWN_VERDICT,
    BuryVerdict,
    ParkVerdict,
    RequeueVerdict,
    build_obituary,
    bury_verdict,
    decide_letter,
)

NOW = 1_700_000_000_000


def death(queue: str = "billing", reason: str = "rejected", count: int = 1) -> dict[str, Any]:
    return {
        "queue": queue,
        "reason": reason,
        "count": count,
        "exchange": "events",
        "routing-keys": ["billing.created"],
        "time": datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
    }


def letter(
    headers: dict[str, Any] | None = None,
    props: dict[str, Any] | None = None,
    body: bytes = b'{"n": 1}',
    routing_key: str = "billing",
) -> Any:
    return read_dead_letter(
        body,
        headers if headers is not None else {"x-death": [death()]},
        props if props is not None else {"message_id": "m-1", "content_type": "application/json"},
        exchange="celery_dlx",
        routing_key=routing_key,
    )


def config(**conf: Any) -> Any:
    base: dict[str, Any] = {
        "dlx_queues": {
            "billing": {
                "backoff": [10, 100, 1000],
                "max_parks": 3,
                "max_requeues": 0,
                "importance": "page",
            }
        },
    }
    base.update(conf)
    return load_config(base)


def with_state(state: DLXState, reason: str = "rejected") -> dict[str, Any]:
    return {"x-death": [death(reason=reason)], **state_headers(state)}


# -- reading ------------------------------------------------------------------------------------


def test_reads_queue_reason_and_identity_from_x_death() -> None:
    dl = letter()
    assert (dl.queue, dl.death_reason, dl.identity, dl.problem) == (
        "billing",
        "rejected",
        "m-1",
        None,
    )
    assert dl.death_ms == int(datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc).timestamp() * 1000)
    assert dl.task is None and dl.scope == "billing"


def test_newest_x_death_names_the_queue() -> None:
    dl = letter({"x-death": [death("work", "rejected"), death("work_dlq_10", "expired")]})
    assert (dl.queue, dl.death_reason) == ("work", "rejected")


def test_look_alikes_without_message_id_never_share_an_identity_or_key() -> None:
    """Two messages with one body and no message_id are two messages (issue 12)."""
    a = letter(props={}, body=b"payload")
    b = letter(props={}, body=b"payload")
    digest = a.identity.split("~")[0]
    assert a.identity.startswith("sha1-") and b.identity.startswith(digest + "~")
    assert a.identity != b.identity and a.key != b.key
    assert not a.provable and not b.provable


def test_a_look_alike_keeps_its_key_on_the_same_delivery_only() -> None:
    """A settle retried on the same delivery gives the same key (no second fate); a delivery
    with another name, a redelivery after a crash included, gets another."""
    headers = {"x-death": [death()]}

    def read(delivery: str, redelivered: bool = False) -> Any:
        return read_dead_letter(
            b"payload",
            headers,
            {},
            routing_key="billing",
            redelivered=redelivered,
            delivery=delivery,
        )

    assert read("chan-1:7").key == read("chan-1:7").key
    assert read("chan-1:7").identity == read("chan-1:7").identity
    assert read("chan-1:7").key != read("chan-1:8").key
    assert read("chan-1:7").key != read("chan-2:7", redelivered=True).key


def test_a_look_alike_copy_is_stamped_and_its_next_death_is_provable() -> None:
    first = letter({"x-death": [death()]}, props={}, body=b"payload")
    verdict = decide_letter(first, config(), None, NOW)
    assert isinstance(verdict, ParkVerdict)
    copy = first.copy_headers(verdict.state)
    assert copy["x-dlx-id"] == first.identity
    second = letter({**copy, "x-death": [death()]}, props={}, body=b"payload")
    again = letter({**copy, "x-death": [death()]}, props={}, body=b"payload")
    assert second.provable and second.identity == first.identity
    assert second.key == again.key != first.key  # a redelivery of it is recognised


def test_a_provable_message_is_not_stamped() -> None:
    first = letter()
    verdict = decide_letter(first, config(), None, NOW)
    assert isinstance(verdict, ParkVerdict)
    assert "x-dlx-id" not in first.copy_headers(verdict.state)


def test_a_provable_message_has_one_obituary_id_whatever_its_death() -> None:
    """Two copies of one message a crash left behind die with different histories: one id."""
    a = letter({"x-death": [death()], **state_headers(DLXState(attempt=4, parks=2))})
    b = letter(
        {
            "x-death": [death()],
            **state_headers(DLXState(attempt=4, parks=2, history=(HistoryEntry(7, "parked"),))),
        }
    )
    assert a.key != b.key and a.burial_key == b.burial_key
    other_queue = letter({"x-death": [death("audit")]})
    replayed = letter({"x-death": [death()], REPLAYED_HEADER: "ob-1"})
    assert len({a.burial_key, other_queue.burial_key, replayed.burial_key}) == 3
    look_alike = letter(props={}, body=b"payload")
    assert look_alike.burial_key == look_alike.key  # no provable identity: per delivery
    # Two lineages of one message (an original redelivered after its park was written, stamped
    # with another first failure): one obituary id, whatever the time of a failure.
    first = letter({"x-death": [death()], **state_headers(DLXState(attempt=2, first_failure_ms=5))})
    again = letter({"x-death": [death()], **state_headers(DLXState(attempt=2, first_failure_ms=9))})
    assert first.burial_key == again.burial_key


def test_a_correlation_id_is_not_an_identity() -> None:
    a = letter(props={"correlation_id": "request-1"}, body=b"reply")
    b = letter(props={"correlation_id": "request-1"}, body=b"reply")
    assert not a.provable and a.key != b.key


def test_celery_task_id_and_name_come_from_headers() -> None:
    dl = letter({"x-death": [death("celery")], "id": "t-9", "task": "proj.tasks.add"}, props={})
    assert (dl.identity, dl.task, dl.scope) == ("t-9", "proj.tasks.add", "proj.tasks.add")


def test_key_is_stable_for_a_redelivery_and_distinct_per_death() -> None:
    base = letter()
    redelivered = read_dead_letter(
        b'{"n": 1}', {"x-death": [death()]}, {"message_id": "m-1"}, redelivered=True
    )
    assert base.key == redelivered.key
    other_queue = letter({"x-death": [death("audit")]})
    later = letter(
        with_state(DLXState(attempt=1, parks=1, history=(HistoryEntry(5, "parked", "c"),)))
    )
    replayed = letter({"x-death": [death()], REPLAYED_HEADER: "ob-1"})
    assert len({base.key, other_queue.key, later.key, replayed.key}) == 4


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-death": ["not-a-table"]}, "undecodable: x-death[0] must be a table"),
        ({"x-death": "nope"}, "undecodable: x-death must be a list"),
        ({"x-death": [death()], ATTEMPT_HEADER: "abc"}, "undecodable: header x-dlx-attempt"),
        ({"x-death": [death()], "x-dlx-history": "{bad json"}, "undecodable: header x-dlx-history"),
    ],
)
def test_unreadable_headers_become_a_problem_not_an_exception(
    headers: dict[str, Any], expected: str
) -> None:
    dl = letter(headers)
    assert dl.problem is not None and dl.problem.startswith(expected)
    verdict = decide_letter(dl, config(), None, NOW)
    assert isinstance(verdict, BuryVerdict)
    assert verdict.reason.startswith(expected)
    assert verdict.exc_type == "undecodable"


def test_body_that_is_not_bytes_is_a_problem() -> None:
    dl = read_dead_letter("text", {"x-death": [death()]}, {})  # type: ignore[arg-type]
    assert dl.problem is not None and "body is str" in dl.problem
    assert isinstance(decide_letter(dl, config(), None, NOW), BuryVerdict)


def test_nothing_naming_the_queue_is_a_problem() -> None:
    dl = read_dead_letter(b"x", {}, {}, routing_key="")
    assert dl.queue == "unknown" and dl.problem is not None


header_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
header_names = st.sampled_from(
    [
        "x-death",
        ATTEMPT_HEADER,
        "x-dlx-requeues",
        "x-dlx-parks",
        "x-dlx-history",
        QUEUE_HEADER,
        REASON_HEADER,
        REPLAYED_HEADER,
        "x-dlx-first-failure-ms",
        "id",
        "task",
        "other",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    headers=st.dictionaries(header_names, header_values, max_size=6),
    props=st.dictionaries(
        st.sampled_from(["message_id", "correlation_id", "type"]), header_values, max_size=2
    ),
    body=st.binary(max_size=64),
)
def test_any_headers_are_read_and_decided_without_raising(
    headers: dict[str, Any], props: dict[str, Any], body: bytes
) -> None:
    dl = read_dead_letter(body, headers, props, routing_key="q")
    verdict = decide_letter(dl, config(), None, NOW)
    assert isinstance(verdict, (BuryVerdict, ParkVerdict, RequeueVerdict))
    if isinstance(verdict, BuryVerdict):
        ob = build_obituary(dl, verdict, buried_ms=NOW, code_version=None, hostname="h")
        json.loads(ob.record_json())


# -- deciding -----------------------------------------------------------------------------------


def test_foreign_reject_parks_with_the_queue_backoff_then_buries_after_the_budget() -> None:
    cfg = config()
    state = DLXState()
    delays = []
    for _ in range(3):
        verdict = decide_letter(letter(with_state(state)), cfg, None, NOW)
        assert isinstance(verdict, ParkVerdict) and verdict.counted
        assert verdict.importance == "page"
        delays.append(verdict.delay)
        state = verdict.state
    assert delays == [10, 100, 1000]
    assert (state.attempt, state.parks, state.requeues, state.queue) == (3, 3, 0, "billing")
    assert [e.fate for e in state.history] == ["parked"] * 3
    final = decide_letter(letter(with_state(state)), cfg, None, NOW)
    assert isinstance(final, BuryVerdict)
    assert final.reason.startswith("retry budget spent: 0 requeues, 3 parks")
    assert final.attempt == 4
    assert [e.fate for e in final.history] == ["parked", "parked", "parked", "buried"]
    assert final.importance == "page"


def test_default_policy_requeues_before_parking() -> None:
    cfg = load_config({"dlx_max_requeues": 1, "dlx_max_parks": 1, "dlx_backoff": [7]})
    first = decide_letter(letter(), cfg, None, NOW)
    assert isinstance(first, RequeueVerdict)
    assert (first.state.requeues, first.state.attempt) == (1, 1)
    second = decide_letter(letter(with_state(first.state)), cfg, None, NOW)
    assert isinstance(second, ParkVerdict) and second.delay == 7


def test_cause_is_the_queue_scoped_fingerprint_of_the_failure() -> None:
    state = DLXState(exc_type="billing.Timeout", exc_message="took 31s")
    verdict = decide_letter(letter(with_state(state)), config(), None, NOW)
    assert isinstance(verdict, ParkVerdict)
    assert verdict.cause == fingerprint("billing", "billing.Timeout", "took 99s")
    unknown = decide_letter(letter(), config(), None, NOW)
    assert unknown.cause == fingerprint("billing", "rejected", "")


def test_expired_parks_without_counting_a_failure() -> None:
    cfg = config()
    first = decide_letter(letter({"x-death": [death(reason="expired")]}), cfg, None, NOW)
    assert isinstance(first, ParkVerdict) and not first.counted
    assert (first.state.attempt, first.state.parks, first.delay) == (0, 0, 10)
    assert first.state.history[-1].cause == EXPIRED_CAUSE
    second = decide_letter(letter(with_state(first.state, "expired")), cfg, None, NOW + 1)
    assert isinstance(second, ParkVerdict) and second.delay == 100
    assert (
        letter(with_state(first.state, "expired")).key
        != letter({"x-death": [death(reason="expired")]}).key
    )


@pytest.mark.parametrize(
    "cfg",
    [
        {"dlx_expired": "bury"},
        {"dlx_queues": {"billing": {"expired": "bury"}}},
    ],
)
def test_expired_is_buried_when_configured(cfg: dict[str, Any]) -> None:
    verdict = decide_letter(
        letter({"x-death": [death(reason="expired")]}), load_config(cfg), None, NOW
    )
    assert isinstance(verdict, BuryVerdict)
    assert "expired" in verdict.reason and verdict.attempt == 0


def test_maxlen_parks_skipping_requeues_then_buries() -> None:
    cfg = load_config({"dlx_max_requeues": 5, "dlx_max_parks": 1, "dlx_backoff": [3]})
    first = decide_letter(letter({"x-death": [death(reason="maxlen")]}), cfg, None, NOW)
    assert isinstance(first, ParkVerdict) and first.delay == 3 and first.counted
    second = decide_letter(letter(with_state(first.state, "maxlen")), cfg, None, NOW)
    assert isinstance(second, BuryVerdict)


def test_delivery_limit_buries() -> None:
    verdict = decide_letter(
        letter({"x-death": [death(reason="delivery_limit")]}), config(), None, NOW
    )
    assert isinstance(verdict, BuryVerdict) and "delivery limit" in verdict.reason


def test_cause_record_buries_with_the_workers_facts_even_with_budget_left() -> None:
    record = {
        "task": "proj.tasks.charge",
        "queue": "celery",
        "message_id": "t-1",
        "attempt": 3,
        "cause": "abc123",
        "exc_type": "ValueError",
        "exc_message": "bad card 42",
        "traceback": "Traceback (most recent call last):\n  ...\nValueError: bad card 42",
        "reason": "permanent failure: ValueError",
        "importance": "page",
        "history": [[1, "requeued", "abc123"], [2, "parked", "abc123"], [3, "buried", "abc123"]],
        "first_failure_ms": 1,
        "at_ms": 3,
        "hostname": "worker@a",
    }
    dl = letter({"x-death": [death("celery")], "id": "t-1", "task": "proj.tasks.charge"}, props={})
    stored = CauseRecord.from_json(json.dumps(record))  # as a worker stashed it
    verdict = decide_letter(dl, config(), stored, NOW)
    assert isinstance(verdict, BuryVerdict) and verdict.from_worker
    assert (verdict.reason, verdict.cause, verdict.attempt, verdict.hostname) == (
        "permanent failure: ValueError",
        "abc123",
        3,
        "worker@a",
    )
    ob = build_obituary(dl, verdict, buried_ms=NOW, code_version="v1", hostname="svc")
    assert ob.traceback.endswith("ValueError: bad card 42")
    assert [(a.at_ms, a.fate) for a in ob.attempts] == [
        (1, "requeued"),
        (2, "parked"),
        (3, "buried"),
    ]
    assert (ob.first_failure_ms, ob.last_failure_ms, ob.hostname, ob.origin) == (
        1,
        3,
        "worker@a",
        "celery",
    )
    assert (ob.id, ob.message_id, ob.task, ob.code_version) == (
        dl.burial_key,
        "t-1",
        "proj.tasks.charge",
        "v1",
    )


def test_the_workers_code_version_names_the_obituary_not_the_services() -> None:
    """The code that failed is the worker's: its cause record's version wins over the service's;
    a record without one (an older worker) leaves the service's, and a foreign burial has the
    service's."""
    record = CauseRecord.from_fields(task="proj.tasks.charge", cause="c", code_version="w2")
    stored = CauseRecord.from_json(record.to_json())
    assert stored is not None and stored.code_version == "w2"
    verdict = decide_letter(letter(), config(), stored, NOW)
    assert isinstance(verdict, BuryVerdict)
    ob = build_obituary(letter(), verdict, buried_ms=NOW, code_version="s9", hostname="h")
    assert ob.code_version == "w2"
    older = CauseRecord.from_json(json.dumps({"task": "proj.tasks.charge", "cause": "c"}))
    verdict = decide_letter(letter(), config(), older, NOW)
    assert isinstance(verdict, BuryVerdict)
    ob = build_obituary(letter(), verdict, buried_ms=NOW, code_version="s9", hostname="h")
    assert ob.code_version == "s9"
    foreign = bury_verdict(letter(), config(), "rejected by a consumer", NOW, failed=True)
    ob = build_obituary(letter(), foreign, buried_ms=NOW, code_version="s9", hostname="h")
    assert ob.code_version == "s9"


def test_a_record_without_a_code_version_is_stored_as_before() -> None:
    record = CauseRecord.from_fields(task="t", cause="c")
    assert "code_version" not in json.loads(record.to_json())


def test_cause_record_with_junk_fields_still_buries() -> None:
    record = {"attempt": "x", "history": "nope", "reason": 5, "cause": None}
    verdict = decide_letter(letter(), config(), CauseRecord.from_json(json.dumps(record)), NOW)
    assert isinstance(verdict, BuryVerdict)
    assert verdict.reason == "buried by the worker" and verdict.attempt == 1


def test_message_buried_by_publishing_keeps_the_workers_reason() -> None:
    headers = {
        REASON_HEADER: "undecodable: x-death[0] must be a table",
        QUEUE_HEADER: "orders",
        "id": "t-2",
    }
    dl = read_dead_letter(b"x", headers, {}, routing_key="orders")
    assert (dl.death_reason, dl.queue, dl.problem) == (PUBLISHED, "orders", None)
    verdict = decide_letter(dl, config(), None, NOW)
    assert isinstance(verdict, BuryVerdict) and verdict.reason == headers[REASON_HEADER]


def test_message_published_to_the_dlx_directly_is_buried_not_parked() -> None:
    dl = read_dead_letter(b"x", {}, {"message_id": "m"}, routing_key="orders")
    assert dl.death_reason == UNKNOWN
    verdict = decide_letter(dl, config(), None, NOW)
    assert isinstance(verdict, BuryVerdict) and "origin unknown" in verdict.reason


def test_foreign_obituary_carries_everything() -> None:
    state = DLXState(
        attempt=2,
        parks=2,
        history=(HistoryEntry(10, "parked", "c"), HistoryEntry(20, "parked", "c")),
        first_failure_ms=10,
    )
    cfg = load_config({"dlx_max_parks": 2, "dlx_max_requeues": 0})
    dl = letter(
        {**with_state(state), "custom": b"\x00\x01"}, props={"message_id": "m-7", "priority": 3}
    )
    verdict = decide_letter(dl, cfg, None, NOW)
    assert isinstance(verdict, BuryVerdict)
    ob = build_obituary(dl, verdict, buried_ms=NOW, code_version=None, hostname="svc")
    assert (ob.origin, ob.queue, ob.attempt, ob.death_reason, ob.hostname) == (
        "foreign",
        "billing",
        3,
        "rejected",
        "svc",
    )
    assert [a.at_ms for a in ob.attempts] == [10, 20, NOW]
    assert (ob.first_failure_ms, ob.payload, ob.payload_size) == (10, b'{"n": 1}', 8)
    assert ob.x_death[0]["queue"] == "billing" and "x-death" not in ob.headers  # kept once
    assert ob.headers["custom"] == b"\x00\x01" and ob.properties["priority"] == 3
    record = json.loads(ob.record_json())
    assert record["headers"]["custom"] == {"__bytes__": "0001"}
    assert record["x_death"][0]["time"] == {"__datetime__": "2024-01-02T03:04:05+00:00"}


# -- a worker's decision travels with the message -----------------------------------------------


def test_a_dlx_task_rejection_without_a_record_is_buried_never_requeued() -> None:
    """A DLX worker rejects only to bury: without its cause record the letter is still buried."""
    cfg = config(dlx_queues={"billing": {"max_requeues": 3}})
    celery_letter = letter({"x-death": [death()], "task": "billing.charge"})
    assert isinstance(decide_letter(celery_letter, cfg, None, NOW), RequeueVerdict)  # foreign
    verdict = decide_letter(celery_letter, cfg, None, NOW, dlx_task=True)
    assert isinstance(verdict, BuryVerdict)
    assert verdict.reason == UNKNOWN_VERDICT and verdict.attempt == 1
    # Other deaths of a DLX task's message keep their own rules (a TTL expiry is no burial).
    expired = letter({"x-death": [death(reason="expired")], "task": "billing.charge"})
    assert isinstance(decide_letter(expired, cfg, None, NOW, dlx_task=True), ParkVerdict)


def test_a_graveyard_copy_is_buried_whatever_the_policy() -> None:
    """The copy a worker publishes when Redis refused its cause record (the bury-reason header)."""
    cfg = config(dlx_queues={"billing": {"max_requeues": 3}})
    state = DLXState(attempt=0, queue="billing")
    copy = letter({REASON_HEADER: "permanent failure: ValueError", **state_headers(state)})
    assert copy.death_reason == PUBLISHED and copy.worker_fate is None
    for dlx_task in (False, True):
        verdict = decide_letter(copy, cfg, None, NOW, dlx_task=dlx_task)
        assert isinstance(verdict, BuryVerdict)
        assert verdict.reason == "permanent failure: ValueError"


@pytest.mark.parametrize("dlx_task", [False, True])
def test_a_park_the_worker_could_not_write_is_parked_with_its_own_state(dlx_task: bool) -> None:
    state = DLXState(
        attempt=2,
        parks=2,
        history=(HistoryEntry(1, "parked", "c"), HistoryEntry(2, "parked", "c")),
        queue="billing",
        first_failure_ms=1,
        cause="c",
        exc_type="IOError",
        exc_message="flaky",
    )
    headers = {FATE_HEADER: "parked", DELAY_HEADER: "1.5", **state_headers(state)}
    dl = letter(headers)
    assert (dl.death_reason, dl.worker_fate, dl.worker_delay) == (PUBLISHED, "parked", 1.5)
    verdict = decide_letter(dl, config(), None, NOW, dlx_task=dlx_task)
    assert isinstance(verdict, ParkVerdict)
    # Counted by the worker already: not counted again, the worker's delay kept.
    assert (verdict.delay, verdict.state, verdict.attempt) == (1.5, state, 2)
    assert verdict.failure.exc_type == "IOError"
    copy = dl.copy_headers(verdict.state)
    assert FATE_HEADER not in copy and DELAY_HEADER not in copy
    assert copy[ATTEMPT_HEADER] == 2


def test_a_requeue_the_worker_could_not_publish_is_requeued_as_it_is() -> None:
    state = DLXState(attempt=1, requeues=1, queue="billing", first_failure_ms=1, cause="c")
    dl = letter({FATE_HEADER: b"requeued", **state_headers(state)})
    verdict = decide_letter(dl, config(), None, NOW)
    assert isinstance(verdict, RequeueVerdict) and verdict.state == state


@pytest.mark.parametrize(
    "headers",
    [
        {FATE_HEADER: "buried"},  # not a fate a copy asks for
        {FATE_HEADER: "parked"},  # no delay
        {FATE_HEADER: "parked", DELAY_HEADER: "-1"},
        {FATE_HEADER: "parked", DELAY_HEADER: "inf"},
        {FATE_HEADER: "parked", DELAY_HEADER: "soon"},
    ],
)
def test_an_unreadable_fate_request_is_decided_as_any_letter(headers: dict[str, Any]) -> None:
    dl = letter({"x-death": [death()], **headers})
    assert dl.worker_fate is None and dl.death_reason == "rejected"


def test_a_copy_handed_to_the_service_and_the_death_of_that_copy_are_two_letters() -> None:
    """A worker that could not park attempt 3's retry sends the copy (carrying attempt 4's
    headers) to the service naming its fate; when that retry dies in its turn, its dead letter
    carries the same headers. Read as one letter, the death was acked as handled and lost."""
    state = DLXState(attempt=4, parks=1, history=(HistoryEntry(1_700_000_000_000, "parked", "c"),))
    own = state_headers(state)
    handed = read_dead_letter(
        b'{"n": 1}',
        {**own, "x-dlx-fate": "parked", "x-dlx-delay": "1.0", "x-dlx-queue": "billing"},
        {"message_id": "m-1"},
        routing_key="billing",
    )
    died = read_dead_letter(
        b'{"n": 1}', {**own, "x-death": [death()]}, {"message_id": "m-1"}, routing_key="billing"
    )
    assert handed.worker_fate == "parked" and died.worker_fate is None
    assert handed.key != died.key
    # A redelivery of either is still that letter.
    again = read_dead_letter(
        b'{"n": 1}',
        {**own, "x-death": [death()]},
        {"message_id": "m-1"},
        routing_key="billing",
        redelivered=True,
    )
    assert again.key == died.key
