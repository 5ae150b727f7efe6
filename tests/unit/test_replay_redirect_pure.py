"""Replay to another queue, without a broker: the copy's destination and headers, the history
entry, the ``--json`` keys, the ledger's redirect record and the console's view of it."""

from __future__ import annotations

from celery_dlx.fates import REPLAYED
from celery_dlx.message.names import ATTEMPT_HEADER, QUEUE_HEADER, REPLAYED_HEADER
from celery_dlx.message.obituary import Obituary
from celery_dlx.ops.canary import ReplayRun
from celery_dlx.ops.replay import ReplayReport, _replayed_event, replay_copy
from celery_dlx.store.graveyard import _ledger_redirects, _ledger_times
from celery_dlx_console.payload import obituary_view


def obituary() -> Obituary:
    return Obituary.from_fields(
        id="ob-1",
        message_id="m-1",
        queue="payments",
        reason="r",
        buried_ms=1_000,
        origin="celery",
        headers={
            ATTEMPT_HEADER: 4,
            QUEUE_HEADER: "payments",
            "x-tenant": "acme",
            "x-death": [{"count": 1}],
        },
        payload=b"{}",
        payload_size=2,
    )


def test_a_redirected_copy_goes_to_the_new_queue_and_names_it() -> None:
    ob = obituary()
    home = replay_copy(ob, keep_attempts=True)
    there = replay_copy(ob, keep_attempts=True, to_queue="payments.slow")
    assert (home.exchange, home.routing_key) == ("", "payments")
    assert (there.exchange, there.routing_key) == ("", "payments.slow")
    assert home.headers[QUEUE_HEADER] == "payments"
    assert there.headers[QUEUE_HEADER] == "payments.slow"
    assert {k: v for k, v in there.headers.items() if k != QUEUE_HEADER} == {
        k: v for k, v in home.headers.items() if k != QUEUE_HEADER
    }
    assert there.properties == home.properties and there.body == home.body
    fresh = replay_copy(ob, to_queue="payments.slow")
    assert fresh.headers == {
        "x-tenant": "acme",
        REPLAYED_HEADER: "ob-1",
        QUEUE_HEADER: "payments.slow",
    }
    # not redirected: a fresh copy carries no queue header, as before
    assert QUEUE_HEADER not in replay_copy(ob).headers


def test_the_replayed_event_keeps_the_queue_it_died_in_and_says_where_it_went() -> None:
    ob = obituary()
    plain = _replayed_event(ob, False, False, 5)
    moved = _replayed_event(ob, False, True, 5, "payments.slow")
    assert plain.fate == moved.fate == REPLAYED
    assert plain.queue == moved.queue == "payments"
    assert plain.reason == "replayed from obituary ob-1"
    assert moved.reason == "replayed from obituary ob-1 to queue payments.slow (died in payments)"
    assert moved.extra["to_queue"] == "payments.slow" and moved.extra["from_queue"] == "payments"
    assert "to_queue" not in plain.extra


def test_json_has_the_redirect_keys_only_when_redirected() -> None:
    plain = ReplayRun(targets=1, report=ReplayReport(replayed=["a"])).to_json()
    assert "to_queue" not in plain and "from_queues" not in plain
    report = ReplayReport(replayed=["a"], to_queue="b", from_queues={"q": 1})
    moved = ReplayRun(targets=1, report=report).to_json()
    assert moved["to_queue"] == "b" and moved["from_queues"] == {"q": 1}


def test_the_ledger_record_reads_back_and_tolerates_garbage() -> None:
    raw = b'{"replays": [1, 5, 7], "to": {"5": "other"}}'
    assert _ledger_times(raw) == [1, 5, 7] and _ledger_redirects(raw) == {"5": "other"}
    assert _ledger_redirects(b'{"replays": [1]}') == {}
    assert _ledger_redirects(None) == {} and _ledger_redirects(b"not json") == {}
    assert _ledger_redirects(b'{"to": {"x": "q"}}') == {}


def test_the_obituary_view_marks_each_redirected_replay() -> None:
    ob = obituary()
    ob.replays = [2_000, 3_000]
    view = obituary_view(ob, None, {3_000: "payments.slow"})
    assert [r["to_queue"] for r in view["replays"]] == [None, "payments.slow"]  # type: ignore[attr-defined]
    replayed = [e for e in view["timeline"] if e["fate"] == "replayed"]  # type: ignore[attr-defined]
    assert [e["cause"] for e in replayed] == ["", "to payments.slow"]
