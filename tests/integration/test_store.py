"""The parking store on a real Redis: idempotent parks, leased claims, lease-checked acks.

Claims take an explicit ``now`` (epoch ms), so lease expiry is tested without waiting for it.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_dlx.message.names import Keys
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.store.parking import ParkingStore
from tests.chaos.servers import own_redis

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


def test_park_many_is_one_script_call_and_idempotent_like_park(
    store: ParkingStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch parks in one call, entry by entry as park would: an entry already parked, or
    parked earlier in the same batch, is left as it is (False); the rest are stored (True)."""
    assert store.park(_parked("m0")) is True
    first = _parked("m1", due_ms=T0 + 10)
    again = _parked("m1", due_ms=T0 + 60_000)
    again.body = b"a different body"
    calls: list[int] = []
    batch_script = store.scripts.park_many

    def counted(**kwargs: Any) -> Any:
        calls.append(len(kwargs["args"]))
        return batch_script(**kwargs)

    monkeypatch.setattr(store.scripts, "park_many", counted)
    stored = store.park_many([_parked("m0"), first, again, _parked("m2", attempt=3)])
    assert stored == [False, True, False, True]
    assert calls == [16]  # one call, four arguments per entry
    assert store.count() == 3
    claimed = {m.entry_id: m for m in store.claim(10, LEASE, now=T0 + 10)}
    assert sorted(claimed) == ["m0:1", "m1:1", "m2:3"]
    assert claimed["m1:1"].body == b"body of m1" and claimed["m1:1"].due_ms == T0 + 10
    assert claimed["m2:3"].headers == {"x-dlx-attempt": 3, "raw": b"\x00\x01"}
    assert store.park_many([]) == []


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


def _runtime(key_prefix: str, redis_url: str = "redis://127.0.0.1:6379/0") -> Any:
    from celery import Celery

    from celery_dlx.wiring.runtime import get_runtime

    app = Celery("park-recorded", set_as_current=False)
    app.conf.update(dlx_key_prefix=key_prefix, dlx_redis_url=redis_url)
    return get_runtime(app)


def _parked_event(message: ParkedMessage) -> Any:
    from celery_dlx.fates import PARKED, FateEvent

    return FateEvent.from_fields(
        fate=PARKED,
        queue=message.queue,
        message_id=message.message_id,
        attempt=message.attempt,
        delay=60.0,
        at_ms=T0,
    )


def test_park_recorded_parks_appends_counts_and_notifies_in_one_transaction(
    key_prefix: str, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's park: the entry, its history entry and its counter in one MULTI/EXEC (one
    round trip), the listeners told once; the same calls as Runtime.park + Runtime.record."""
    runtime = _runtime(key_prefix)
    heard: list[str] = []
    runtime.listeners.append(lambda event: heard.append(event.message_id))
    message = _parked("m1", due_ms=T0 + 60_000)
    sent: list[list[str]] = []
    real_execute = type(runtime.redis.pipeline()).execute

    def execute(pipe: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append([str(c[0][0]) for c in pipe.command_stack])
        return real_execute(pipe, *args, **kwargs)

    monkeypatch.setattr(type(runtime.redis.pipeline()), "execute", execute)
    runtime.park_recorded(message, _parked_event(message))
    # One pipeline, no SCRIPT EXISTS: the park script, the history entry, the counter, the
    # retry's marker (a redelivered original finds it after the park was drained).
    assert sent == [["EVALSHA", "XADD", "HINCRBY", "EXPIRE", "SET"]]
    assert redis_client.exists(runtime.keys.copied("orders", "m1", 1))
    assert [m.entry_id for m in runtime.store.claim(10, LEASE, now=T0 + 60_000)] == ["m1:1"]
    ((_, entry),) = runtime.history.read(count=10)
    assert (entry["fate"], entry["message_id"], entry["queue"]) == ("parked", "m1", "orders")
    minute = T0 // 60000
    assert int(redis_client.hget(runtime.keys.counter(minute), "orders|parked")) == 1
    assert heard == ["m1"]


def test_a_batch_of_parks_goes_in_with_its_fates_in_one_round_trip(
    key_prefix: str, redis_client: Any
) -> None:
    """A worker's settler batch: every park (one already parked: left as it is) and every fate,
    in order, with one script call."""
    runtime = _runtime(key_prefix)
    messages = [_parked(f"b{i}", due_ms=T0 + i) for i in range(3)]
    runtime.store.park(messages[1])
    outcomes = runtime.park_recorded_many([(m, _parked_event(m)) for m in messages])
    assert outcomes == [None, None, None]
    claimed = runtime.store.claim(10, LEASE, now=T0 + 10)
    assert [m.entry_id for m in claimed] == ["b0:1", "b1:1", "b2:1"]
    assert [e["message_id"] for _, e in runtime.history.read(count=10)] == ["b0", "b1", "b2"]
    minute = T0 // 60000
    assert int(redis_client.hget(runtime.keys.counter(minute), "orders|parked")) == 3


def test_park_recorded_after_redis_lost_its_scripts_still_parks_once(key_prefix: str) -> None:
    """A Redis restart forgets the Lua scripts: the bare EVALSHA fails inside the transaction
    (the history entry goes in), and the park is made again with the script loaded.

    On a private redis-server: ``SCRIPT FLUSH`` on the shared one would take every other user's
    scripts away too."""
    with own_redis() as server:
        runtime = _runtime(key_prefix, redis_url=server.url)
        before, message = _parked("m1", due_ms=T0), _parked("m2", due_ms=T0)
        runtime.park_recorded(before, _parked_event(before))  # its scripts are loaded now
        client = server.client()
        client.script_flush()
        client.close()
        runtime.park_recorded(message, _parked_event(message))
        claimed = runtime.store.claim(10, LEASE, now=T0)
        assert sorted(m.entry_id for m in claimed) == ["m1:1", "m2:1"]
        assert [e["message_id"] for _, e in runtime.history.read(count=10)] == ["m1", "m2"]


def test_park_recorded_with_redis_down_raises_and_tells_no_listener(
    key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing parked means no fate: the error reaches the task (which falls back to the
    dead-letter path); no listener hears of a park and no `parked` line is logged."""
    import logging

    import redis

    runtime = _runtime(key_prefix, redis_url="redis://127.0.0.1:1/0")
    heard: list[str] = []
    runtime.listeners.append(lambda event: heard.append(event.message_id))
    message = _parked("m3")
    with caplog.at_level(logging.INFO, logger="celery_dlx"), pytest.raises(redis.ConnectionError):
        runtime.park_recorded(message, _parked_event(message))
    assert heard == []
    assert not [r for r in caplog.records if r.getMessage().startswith("parked")]
