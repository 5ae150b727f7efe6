"""Which copy a redelivered original already became, and the fate copy a worker sends: pure."""

from __future__ import annotations

import pytest

from celery_dlx.message.fate_copy import fate_copy
from celery_dlx.message.headers import DLXState, HistoryEntry, read_state, state_headers
from celery_dlx.message.lineage import (
    ANY_LINEAGE,
    follows,
    lineage,
    next_park_id,
    park_entry_id,
    same_lineage,
)
from celery_dlx.message.names import DELAY_HEADER, FATE_HEADER, HISTORY_LIMIT, QUEUE_HEADER
from celery_dlx.message.outgoing import Outgoing
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.policy.deadletter import read_dead_letter


def parked_after(delivery: DLXState, at_ms: int, queue: str = "work") -> DLXState:
    return delivery.after_failure(fate="parked", at_ms=at_ms, cause="c", queue=queue)


def test_the_park_entry_id_is_the_parking_stores() -> None:
    entry = ParkedMessage(message_id="m-1", attempt=3, queue="q", body=b"")
    assert park_entry_id("m-1", 3) == entry.entry_id
    assert next_park_id("m-1", DLXState(attempt=2)) == entry.entry_id
    with pytest.raises(ValueError, match="attempt"):
        park_entry_id("m-1", -1)


@pytest.mark.parametrize("earlier", [0, 1, 5, HISTORY_LIMIT - 1, HISTORY_LIMIT, HISTORY_LIMIT + 3])
def test_a_park_follows_the_delivery_it_retries(earlier: int) -> None:
    delivery = DLXState()
    for n in range(earlier):
        delivery = parked_after(delivery, 100 + n)
    park = parked_after(delivery, 9_000)
    assert follows(read_state(state_headers(park)), "work", delivery, "work")


def test_another_lineage_or_queue_or_attempt_does_not_follow() -> None:
    original = DLXState()
    first = parked_after(original, 1_000)
    # the original redelivered after its park: the park follows it, whatever the clock says now
    assert follows(first, "work", original, "work")
    assert not follows(first, "other", original, "work")
    # a later death of the same message id (its park of attempt 2, the drained copy's retry)
    second = parked_after(first, 2_000)
    assert not follows(second, "work", original, "work")
    assert follows(second, "work", first, "work")
    # a message reusing the id after an earlier life: same attempt, another history
    reused = parked_after(DLXState(history=(HistoryEntry(5, "parked", "x"),)), 3_000)
    assert not follows(reused, "work", DLXState(attempt=0), "work")
    assert not follows(DLXState(attempt=1), "work", original, "work")  # no history at all


def test_a_fate_copy_names_its_fate_and_goes_to_the_dead_letter_exchange() -> None:
    state = parked_after(DLXState(), 1_000)
    copy = Outgoing(body=b"{}", routing_key="work", headers=state_headers(state))
    sent = fate_copy(copy, fate="parked", exchange="celery_dlx", queue="work", delay=2.5)
    assert (sent.exchange, sent.routing_key, sent.body) == ("celery_dlx", "work", b"{}")
    assert sent.headers[FATE_HEADER] == "parked" and sent.headers[DELAY_HEADER] == "2.500"
    assert sent.headers[QUEUE_HEADER] == "work"
    assert FATE_HEADER not in copy.headers  # the copy itself is left alone
    letter = read_dead_letter(sent.body, sent.headers, {"message_id": "m-1"}, exchange="celery_dlx")
    assert (letter.worker_fate, letter.worker_delay, letter.queue) == ("parked", 2.5, "work")
    assert letter.state == state
    requeued = fate_copy(sent, fate="requeued", exchange="celery_dlx", queue="work")
    assert requeued.headers[FATE_HEADER] == "requeued" and DELAY_HEADER not in requeued.headers


@pytest.mark.parametrize(
    ("fate", "delay"), [("buried", None), ("parked", None), ("parked", -1.0), ("parked", 1e400)]
)
def test_a_fate_copy_refuses_what_the_service_could_not_carry_out(
    fate: str, delay: float | None
) -> None:
    with pytest.raises(ValueError, match="fate copy"):
        fate_copy(
            Outgoing(body=b"", routing_key="q"), fate=fate, exchange="x", queue="q", delay=delay
        )


def test_a_retry_marker_matches_its_own_lineage_only() -> None:
    first = DLXState(attempt=1, first_failure_ms=1_700_000_000_000)
    mine = lineage(first, None)
    assert same_lineage(mine, mine)
    # the same message replayed from its obituary starts a lineage of its own
    assert not same_lineage(mine, lineage(first, "ob-1"))
    assert not same_lineage(lineage(DLXState(), "ob-1"), lineage(DLXState(), None))
    # another first failure: another lineage of the same message id
    assert not same_lineage(mine, lineage(DLXState(attempt=1, first_failure_ms=1), None))
    # a marker the DLX service wrote (or an older release's) names no lineage: any but a replay
    assert same_lineage(ANY_LINEAGE, mine) and same_lineage("1", mine)
    assert not same_lineage(ANY_LINEAGE, lineage(first, "ob-1"))
