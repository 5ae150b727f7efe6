"""The parking store on a real Redis: idempotent parks, leased claims, lease-checked acks.

Claims take an explicit ``now`` (epoch ms), so lease expiry is tested without waiting for it.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_dlx.message.names import Keys
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.store.parking import ParkingStore

T0 = 1_700_000_000_000
LEASE = 1_500


@pytest.fixture
def store(redis_client: Any, keys: Keys) -> ParkingStore:
    return ParkingStore(redis_client, keys)


def _parked(message_id: str, attempt: int = 1, due_ms: int = T0, **extra: Any) -> ParkedMessage:
    return ParkedMessage(
        message_id=message_id,
        attempt=attempt,
        queue="orders",
        body=f"body of {message_id}".encode(),
        headers={"x-dlx-attempt": attempt, "raw": b"\x00\x01"},
        properties={"content_type": "application/json", "correlation_id": message_id},
        due_ms=due_ms,
        **extra,
    )


def test_park_is_idempotent_per_message_id_and_attempt(store: ParkingStore) -> None:
    assert store.park(_parked("m1", attempt=1)) is True
    again = _parked("m1", attempt=1, due_ms=T0 + 60_000)
    again.body = b"a different body"
    assert store.park(again) is False
    assert store.park(_parked("m1", attempt=2)) is True
    assert store.count() == 2

    claimed = store.claim(10, LEASE, now=T0)
    assert [m.entry_id for m in claimed] == ["m1:1", "m1:2"]
    first = claimed[0]
    assert first.body == b"body of m1"
    assert first.due_ms == T0
    assert first.headers == {"x-dlx-attempt": 1, "raw": b"\x00\x01"}
    assert first.properties == {"content_type": "application/json", "correlation_id": "m1"}


def test_only_due_entries_are_claimed_in_due_order_up_to_the_limit(store: ParkingStore) -> None:
    for i, offset in enumerate([300, 100, 200, 5_000]):
        store.park(_parked(f"m{i}", due_ms=T0 + offset))
    assert store.claim(10, LEASE, now=T0 + 99) == []
    assert store.due_count(now=T0 + 300) == 3

    claimed = store.claim(2, LEASE, now=T0 + 300)
    assert [m.message_id for m in claimed] == ["m1", "m2"]
    assert [m.message_id for m in store.claim(10, LEASE, now=T0 + 300)] == ["m0"]
    assert store.claim(10, LEASE, now=T0 + 300 + LEASE - 1) == []
    assert store.count() == 4


def test_claim_hides_entries_for_the_lease_and_returns_them_after(store: ParkingStore) -> None:
    for i in range(3):
        store.park(_parked(f"m{i}"))
    first = store.claim(10, LEASE, now=T0)
    assert len(first) == 3
    assert {m.lease_score for m in first} == {T0 + LEASE}

    assert store.claim(10, LEASE, now=T0) == []
    assert store.claim(10, LEASE, now=T0 + LEASE - 1) == []
    assert store.due_count(now=T0 + LEASE - 1) == 0

    second = store.claim(10, LEASE, now=T0 + LEASE)
    assert sorted(m.entry_id for m in second) == ["m0:1", "m1:1", "m2:1"]
    assert {m.lease_score for m in second} == {T0 + 2 * LEASE}
    # The original due time survives re-claims (the drain measures lateness against it).
    assert {m.due_ms for m in second} == {T0}


def test_ack_deletes_confirmed_entries(store: ParkingStore, redis_client: Any, keys: Keys) -> None:
    for i in range(3):
        store.park(_parked(f"m{i}"))
    claimed = store.claim(10, LEASE, now=T0)
    assert store.ack(claimed[:2]) == 2
    assert store.count() == 1
    assert redis_client.hlen(keys.parked_meta) == 1
    assert redis_client.hlen(keys.parked_body) == 1
    assert store.ack([]) == 0


def test_ack_with_a_stale_lease_deletes_nothing(store: ParkingStore) -> None:
    store.park(_parked("m1"))
    stale = store.claim(10, LEASE, now=T0)
    fresh = store.claim(10, LEASE, now=T0 + LEASE)
    assert [m.entry_id for m in fresh] == ["m1:1"]

    assert store.ack(stale) == 0
    assert store.count() == 1
    assert store.claim(10, LEASE, now=T0 + LEASE) == []  # still leased to the second claim

    assert store.ack(fresh) == 1
    assert store.count() == 0


def test_ack_after_release_deletes_nothing(store: ParkingStore) -> None:
    store.park(_parked("m1"))
    claimed = store.claim(10, LEASE, now=T0)
    store.release(claimed, due_ms=T0 + 10)
    assert store.ack(claimed) == 0
    again = store.claim(10, LEASE, now=T0 + 10)
    assert [m.entry_id for m in again] == ["m1:1"]


def test_release_makes_claimed_entries_due_again(store: ParkingStore) -> None:
    store.park(_parked("m1"))
    store.park(_parked("m2"))
    claimed = store.claim(10, LEASE, now=T0)
    store.release(claimed[:1], due_ms=T0 + 200)
    assert store.claim(10, LEASE, now=T0 + 199) == []
    assert [m.message_id for m in store.claim(10, LEASE, now=T0 + 200)] == ["m1"]


def test_release_does_not_resurrect_a_deleted_entry(store: ParkingStore) -> None:
    store.park(_parked("m1"))
    claimed = store.claim(10, LEASE, now=T0)
    assert store.ack(claimed) == 1
    store.release(claimed, due_ms=T0)
    assert store.count() == 0


def test_an_entry_with_unreadable_metadata_stays_leased_and_visible(
    store: ParkingStore, redis_client: Any, keys: Keys
) -> None:
    store.park(_parked("good"))
    redis_client.zadd(keys.parked_due, {"bad:1": T0})
    redis_client.hset(keys.parked_meta, "bad:1", b"{not json")
    claimed = store.claim(10, LEASE, now=T0)
    assert [m.entry_id for m in claimed] == ["good:1"]
    assert store.count() == 2
    assert redis_client.zscore(keys.parked_due, "bad:1") == T0 + LEASE


def test_an_index_entry_without_metadata_is_dropped(
    store: ParkingStore, redis_client: Any, keys: Keys
) -> None:
    redis_client.zadd(keys.parked_due, {"orphan:1": T0})
    assert store.claim(10, LEASE, now=T0) == []
    assert store.count() == 0


def test_peek_and_remove(store: ParkingStore) -> None:
    store.park(_parked("m1", due_ms=T0 + 2))
    store.park(_parked("m2", due_ms=T0 + 1))
    assert [m.message_id for m in store.peek()] == ["m2", "m1"]
    assert store.remove(["m2:1"]) == 1
    assert [m.message_id for m in store.peek()] == ["m1"]
    assert store.remove([]) == 0
