"""The failure record: one :class:`Failure` carried by fate events, cause records, verdicts and
obituaries, whose stored and flat forms are those the code wrote before it (no I/O).

The literals below were written by celery_dlx before the failure record existed (commit 64c724a):
records stored in Redis by such a version read back to the same values and re-serialize byte for
byte.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone
from typing import Any

import pytest

from celery_dlx.fates import PARKED, FateEvent
from celery_dlx.message.cause import CauseRecord
from celery_dlx.message.failure import FAILURE_FIELDS, Failure
from celery_dlx.message.headers import DLXState, HistoryEntry, state_headers
from celery_dlx.message.obituary import Obituary
from celery_dlx.policy.config import load_config
from celery_dlx.policy.deadletter import read_dead_letter
from celery_dlx.policy.verdicts import (
    BuryVerdict,
    ParkVerdict,
    RequeueVerdict,
    build_obituary,
    decide_letter,
)
from celery_dlx.service.settle import _retry_event, _Work

OLD_CAUSE = '{"task":"proj.tasks.charge","queue":"billing","message_id":"m-7","attempt":4,"cause":"c0ffee","exc_type":"KeyError","exc_message":"\'sku\' \\u2615 \\"q\\"","reason":"retry budget spent","importance":"page","traceback":"Traceback (most recent call last):\\n  ...\\nKeyError: \'sku\'\\n","history":[[1000,"parked","c0ffee"],[4000,"buried","c0ffee"]],"first_failure_ms":1000,"at_ms":4000,"hostname":"w1@host"}'

OLD_CAUSE_UNKNOWN = '{"task":null,"queue":"","message_id":"m-8","attempt":null,"cause":"","exc_type":"","exc_message":"","reason":"","importance":"","traceback":"","history":[],"first_failure_ms":null,"at_ms":null,"hostname":null}'

OLD_OBITUARY = '{"id":"ob-1","message_id":"m-7","queue":"billing","reason":"retry budget spent \\u2615","buried_ms":4100,"task":"proj.tasks.charge","origin":"celery","cause":"c0ffee","exc_type":"KeyError","exc_message":"\'sku\'","traceback":"Traceback...\\nKeyError: \'sku\'\\n","importance":"page","attempt":4,"first_failure_ms":1000,"last_failure_ms":4000,"death_reason":"rejected","exchange":"dlx","routing_key":"billing","payload_size":2,"code_version":"v1.2","hostname":"w1@host","replayed_from":"ob-0","attempts":[{"at_ms":1000,"fate":"parked","cause":"c0ffee"},{"at_ms":4000,"fate":"buried","cause":"c0ffee"}],"headers":{"bin":{"__bytes__":"ff00"},"n":7,"d":{"__decimal__":"1.5"}},"properties":{"content_type":"application/json","message_id":"m-7"},"x_death":[{"queue":"billing","count":1,"time":{"__datetime__":"2024-01-01T00:00:00+00:00"}}]}'

OLD_OBITUARY_MINIMAL = '{"id":"o","message_id":"m","queue":"q","reason":"r","buried_ms":1,"task":null,"origin":"foreign","cause":"","exc_type":"","exc_message":"","traceback":"","importance":"notify","attempt":0,"first_failure_ms":null,"last_failure_ms":null,"death_reason":"","exchange":"","routing_key":"","payload_size":0,"code_version":null,"hostname":null,"replayed_from":null,"attempts":[],"headers":{},"properties":{},"x_death":[]}'

OLD_SUMMARY = {
    "id": "ob-1",
    "message_id": "m-7",
    "queue": "billing",
    "task": "proj.tasks.charge",
    "origin": "celery",
    "reason": "retry budget spent ☕",
    "cause": "c0ffee",
    "exc_type": "KeyError",
    "exc_message": "'sku'",
    "importance": "page",
    "attempt": 4,
    "death_reason": "rejected",
    "buried_ms": 4100,
    "first_failure_ms": 1000,
    "last_failure_ms": 4000,
    "payload_size": 2,
    "content_type": "application/json",
    "code_version": "v1.2",
    "hostname": "w1@host",
}

OLD_JSON_SAFE = '{"id": "ob-1", "message_id": "m-7", "queue": "billing", "reason": "retry budget spent \\u2615", "buried_ms": 4100, "task": "proj.tasks.charge", "origin": "celery", "cause": "c0ffee", "exc_type": "KeyError", "exc_message": "\'sku\'", "traceback": "Traceback...\\nKeyError: \'sku\'\\n", "importance": "page", "attempt": 4, "first_failure_ms": 1000, "last_failure_ms": 4000, "death_reason": "rejected", "exchange": "dlx", "routing_key": "billing", "payload_size": 2, "code_version": "v1.2", "hostname": "w1@host", "replayed_from": "ob-0", "attempts": [{"at_ms": 1000, "fate": "parked", "cause": "c0ffee"}, {"at_ms": 4000, "fate": "buried", "cause": "c0ffee"}], "headers": {"bin": {"__bytes__": "ff00"}, "n": 7, "d": {"__decimal__": "1.5"}}, "properties": {"content_type": "application/json", "message_id": "m-7"}, "x_death": [{"queue": "billing", "count": 1, "time": {"__datetime__": "2024-01-01T00:00:00+00:00"}}], "replays": [], "payload": {"base64": "e30=", "size": 2, "content_type": "application/json", "content_encoding": null, "truncated": false}}'

OLD_EVENT_ITEMS = [
    ("fate", "parked"),
    ("queue", "orders"),
    ("message_id", "m-1"),
    ("attempt", 2),
    ("task", "t"),
    ("cause", "c"),
    ("exc_type", "E"),
    ("exc_message", "boom"),
    ("reason", "r"),
    ("delay", 1.5),
    ("importance", "ignore"),
    ("traceback", "tb"),
    ("first_failure_ms", 10),
    ("at_ms", 20),
    ("extra", {"k": [1]}),
]

OLD_BURIED_EVENT_ITEMS = [
    ("fate", "buried"),
    ("queue", "billing"),
    ("message_id", "m-7"),
    ("attempt", 4),
    ("task", "proj.tasks.charge"),
    ("cause", "c0ffee"),
    ("exc_type", "KeyError"),
    ("exc_message", "'sku'"),
    ("reason", "retry budget spent ☕"),
    ("delay", None),
    ("importance", "page"),
    ("traceback", "Traceback...\nKeyError: 'sku'\n"),
    ("first_failure_ms", 1000),
    ("at_ms", 4100),
    ("extra", {"obituary_id": "ob-1"}),
]

OLD_DECIDED = {
    "park_event": {
        "fate": "parked",
        "queue": "billing",
        "message_id": "m-1",
        "attempt": 2,
        "task": None,
        "cause": "1b3f9c348b867c38",
        "exc_type": "rejected",
        "exc_message": "",
        "reason": "rejected in billing",
        "delay": 10.0,
        "importance": "page",
        "traceback": "",
        "first_failure_ms": 1699999995000,
        "at_ms": 1700000000000,
        "extra": {"source": "dlx-service", "death_reason": "rejected", "counted": True},
    },
    "limit_obituary": '{"id":"0e7af618b84042679d09","message_id":"m-1","queue":"billing","reason":"delivery limit reached in billing (x-delivery-limit)","buried_ms":1700000000001,"task":null,"origin":"foreign","cause":"f95ccf552ae3a5c0","exc_type":"delivery_limit","exc_message":"","traceback":"","importance":"page","attempt":2,"first_failure_ms":1699999995000,"last_failure_ms":1704164645000,"death_reason":"delivery_limit","exchange":"celery_dlx","routing_key":"billing","payload_size":8,"code_version":"v9","hostname":"svc","replayed_from":null,"attempts":[{"at_ms":1699999995000,"fate":"parked","cause":"c1"},{"at_ms":1700000000000,"fate":"buried","cause":"f95ccf552ae3a5c0"}],"headers":{"x-dlx-attempt":1,"x-dlx-requeues":0,"x-dlx-parks":0,"x-dlx-history":"[[1699999995000,\\"parked\\",\\"c1\\"]]","x-dlx-first-failure-ms":1699999995000},"properties":{"message_id":"m-1","content_type":"application/json"},"x_death":[{"queue":"billing","reason":"delivery_limit","count":1,"exchange":"events","routing-keys":["billing.created"],"time":{"__datetime__":"2024-01-02T03:04:05+00:00"}}]}',
    "record_obituary": '{"id":"0e7af618b84042679d09","message_id":"m-1","queue":"billing","reason":"buried by the worker","buried_ms":1700000000002,"task":"proj.charge","origin":"celery","cause":"79830f84f28285f7","exc_type":"KeyError","exc_message":"sku","traceback":"TB","importance":"page","attempt":2,"first_failure_ms":1699999995000,"last_failure_ms":1700000000000,"death_reason":"rejected","exchange":"celery_dlx","routing_key":"billing","payload_size":8,"code_version":null,"hostname":"w1","replayed_from":null,"attempts":[{"at_ms":1699999995000,"fate":"parked","cause":"c1"},{"at_ms":1700000000000,"fate":"buried","cause":""}],"headers":{"x-dlx-attempt":1,"x-dlx-requeues":0,"x-dlx-parks":0,"x-dlx-history":"[[1699999995000,\\"parked\\",\\"c1\\"]]","x-dlx-first-failure-ms":1699999995000},"properties":{"message_id":"m-1","content_type":"application/json"},"x_death":[{"queue":"billing","reason":"rejected","count":1,"exchange":"events","routing-keys":["billing.created"],"time":{"__datetime__":"2024-01-02T03:04:05+00:00"}}]}',
    "record_buried_event": {
        "fate": "buried",
        "queue": "billing",
        "message_id": "m-1",
        "attempt": 2,
        "task": "proj.charge",
        "cause": "79830f84f28285f7",
        "exc_type": "KeyError",
        "exc_message": "sku",
        "reason": "buried by the worker",
        "delay": None,
        "importance": "page",
        "traceback": "TB",
        "first_failure_ms": 1699999995000,
        "at_ms": 1700000000002,
        "extra": {},
    },
}


def test_a_stored_cause_record_reads_back_and_rewrites_identically() -> None:
    record = CauseRecord.from_json(OLD_CAUSE)
    assert record is not None
    assert record.failure == Failure(
        task="proj.tasks.charge",
        queue="billing",
        message_id="m-7",
        attempt=4,
        cause="c0ffee",
        exc_type="KeyError",
        exc_message="'sku' \u2615 \"q\"",
        reason="retry budget spent",
        importance="page",
        traceback="Traceback (most recent call last):\n  ...\nKeyError: 'sku'\n",
        first_failure_ms=1000,
        at_ms=4000,
        hostname="w1@host",
    )
    assert record.history == (
        HistoryEntry(1000, "parked", "c0ffee"),
        HistoryEntry(4000, "buried", "c0ffee"),
    )
    assert (record.attempt, record.at_ms, record.hostname) == (4, 4000, "w1@host")
    assert record.to_json() == OLD_CAUSE


def test_an_unknown_cause_record_keeps_its_unknowns() -> None:
    record = CauseRecord.from_fields(message_id="m-8")
    assert record.to_json() == OLD_CAUSE_UNKNOWN
    assert (record.attempt, record.importance, record.at_ms, record.task) == (None, "", None, None)
    assert CauseRecord.from_json(OLD_CAUSE_UNKNOWN) == record


def test_a_stored_obituary_reads_back_and_rewrites_identically() -> None:
    ob = Obituary.from_record(OLD_OBITUARY, b"{}")
    assert (ob.message_id, ob.queue, ob.task, ob.attempt) == (
        "m-7",
        "billing",
        "proj.tasks.charge",
        4,
    )
    assert (ob.first_failure_ms, ob.last_failure_ms, ob.failure.at_ms) == (1000, 4000, 4000)
    assert (ob.code_version, ob.hostname, ob.replayed_from) == ("v1.2", "w1@host", "ob-0")
    assert ob.record_json() == OLD_OBITUARY
    assert json.dumps(ob.record()) == json.dumps(json.loads(OLD_OBITUARY))
    assert ob.summary() == OLD_SUMMARY
    assert list(ob.summary()) == list(OLD_SUMMARY)
    assert json.dumps(ob.json_safe()) == OLD_JSON_SAFE
    assert Obituary.from_record(ob.record(), b"{}") == ob


def test_a_minimal_obituary_has_the_defaults_it_always_had() -> None:
    ob = Obituary.from_record(
        {"id": "o", "message_id": "m", "queue": "q", "reason": "r", "buried_ms": 1}
    )
    assert (ob.importance, ob.attempt, ob.origin) == ("notify", 0, "foreign")
    assert ob.record_json() == OLD_OBITUARY_MINIMAL


def test_the_flat_event_is_unchanged() -> None:
    event = FateEvent.from_fields(
        "parked",
        queue="orders",
        message_id="m-1",
        attempt=2,
        task="t",
        cause="c",
        exc_type="E",
        exc_message="boom",
        reason="r",
        delay=1.5,
        importance="ignore",
        traceback="tb",
        first_failure_ms=10,
        at_ms=20,
        extra={"k": [1]},
    )
    assert list(event.as_dict().items()) == OLD_EVENT_ITEMS
    # as_dict copies: changing it leaves the event alone.
    event.as_dict()["extra"]["k"].append(2)
    assert event.extra == {"k": [1]}


def test_an_event_is_stamped_now_and_defaults_to_notify() -> None:
    event = FateEvent.from_fields("requeued", queue="q", message_id="m", attempt=1)
    assert event.importance == "notify" and event.at_ms > 1_700_000_000_000
    assert FateEvent.of("requeued", Failure(queue="q")).attempt == 0


def test_an_obituary_event_is_unchanged() -> None:
    ob = Obituary.from_record(OLD_OBITUARY, b"{}")
    event = ob.fate_event("buried", 4100, traceback=ob.traceback, extra={"obituary_id": ob.id})
    assert list(event.as_dict().items()) == [tuple(i) for i in OLD_BURIED_EVENT_ITEMS]
    assert ob.last_failure_ms == 4000  # the event's time is its own


NOW = 1_700_000_000_000


def _letter(reason: str) -> Any:
    state = DLXState(
        attempt=1, history=(HistoryEntry(NOW - 5000, "parked", "c1"),), first_failure_ms=NOW - 5000
    )
    death = {
        "queue": "billing",
        "reason": reason,
        "count": 1,
        "exchange": "events",
        "routing-keys": ["billing.created"],
        "time": datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
    }
    return read_dead_letter(
        b'{"n": 1}',
        {"x-death": [death], **state_headers(state)},
        {"message_id": "m-1", "content_type": "application/json"},
        exchange="celery_dlx",
        routing_key="billing",
    )


CONFIG = load_config(
    {
        "dlx_queues": {
            "billing": {
                "backoff": [10, 100],
                "max_requeues": 0,
                "max_parks": 3,
                "importance": "page",
            }
        }
    }
)


def test_the_services_verdicts_give_the_events_and_obituaries_they_gave() -> None:
    letter = _letter("rejected")
    park = decide_letter(letter, CONFIG, None, NOW)
    assert isinstance(park, ParkVerdict)
    assert _retry_event(_Work(None, letter, park), NOW).as_dict() == OLD_DECIDED["park_event"]  # type: ignore[arg-type]

    limited = _letter("delivery_limit")
    bury = decide_letter(limited, CONFIG, None, NOW)
    assert isinstance(bury, BuryVerdict)
    ob = build_obituary(limited, bury, buried_ms=NOW + 1, code_version="v9", hostname="svc")
    assert ob.record_json() == OLD_DECIDED["limit_obituary"]

    record = CauseRecord.from_json(
        '{"task":"proj.charge","queue":"","message_id":"m-1","attempt":null,"cause":"",'
        '"exc_type":"KeyError","exc_message":"sku","reason":"","importance":"","traceback":"TB",'
        '"history":[],"first_failure_ms":null,"at_ms":null,"hostname":"w1"}'
    )
    from_worker = decide_letter(letter, CONFIG, record, NOW)
    assert isinstance(from_worker, BuryVerdict) and from_worker.from_worker
    ob = build_obituary(letter, from_worker, buried_ms=NOW + 2, code_version=None, hostname="svc")
    assert ob.record_json() == OLD_DECIDED["record_obituary"]
    event = ob.fate_event("buried", NOW + 2, traceback=ob.traceback)
    assert event.as_dict() == OLD_DECIDED["record_buried_event"]


def test_a_mutable_holder_replaces_its_frozen_failure() -> None:
    ob = Obituary.from_record(OLD_OBITUARY)
    before = ob.failure
    ob.traceback = "<script>"
    ob.last_failure_ms = 9
    assert ob.failure is not before and before.traceback != "<script>"
    assert (ob.failure.traceback, ob.failure.at_ms) == ("<script>", 9)
    assert json.loads(ob.record_json())["traceback"] == "<script>"
    event = FateEvent.from_fields(PARKED, queue="q", message_id="m", attempt=1)
    event.cause = "c"
    assert event.as_dict()["cause"] == "c"


def test_frozen_holders_stay_frozen() -> None:
    record = CauseRecord.from_fields(cause="c")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.cause = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.failure.cause = "other"  # type: ignore[misc]
    assert record.cause == "c"


@pytest.mark.parametrize(
    "holder", [FateEvent, CauseRecord, Obituary, BuryVerdict, ParkVerdict, RequeueVerdict]
)
def test_a_failures_fields_are_declared_once(holder: type) -> None:
    declared = {f.name for f in dataclasses.fields(holder)}
    assert "failure" in declared
    assert declared & FAILURE_FIELDS == set()
    # ...and read through the failure, as before.
    assert {"cause", "exc_type", "reason", "importance", "attempt"} <= set(dir(holder))


def test_but_copies_a_failure_with_changes() -> None:
    failure = Failure(cause="c", attempt=1)
    changed = failure.but(reason="r", attempt=2)
    assert (failure.reason, failure.attempt) == ("", 1)
    assert changed == Failure(cause="c", reason="r", attempt=2)
    assert hash(changed) == hash(Failure(cause="c", reason="r", attempt=2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        changed.reason = "other"  # type: ignore[misc]
    with pytest.raises(TypeError, match="nope"):
        failure.but(nope=1)
