"""The settler's batch: parks and requeues written by their own means in one pass, each
original acked only when its own copy went in or, when it could not be written, once the copy
went to the DLX service naming its fate (back to its queue when the broker refuses that too),
whatever order they arrived in; never rejected into the dead-letter exchange.

Pure unit tests: the runtime and the requests are stand-ins recording what they are asked."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery

from celery_dlx.errors import PublishError
from celery_dlx.fates import PARKED, REQUEUED, FateEvent
from celery_dlx.message.failure import Failure
from celery_dlx.message.names import DELAY_HEADER, FATE_HEADER
from celery_dlx.message.outgoing import Outgoing
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.worker import marks
from celery_dlx.worker import settler as settler_module
from celery_dlx.worker.settler import ParkHandover, RequeueHandover, Settler


class FakeRequest:
    def __init__(self) -> None:
        self.outcome: str | None = None

    def acknowledge(self) -> None:
        assert self.outcome is None
        self.outcome = "acked"

    def reject(self, requeue: bool = False) -> None:
        assert self.outcome is None
        self.outcome = "requeued" if requeue else "dead-lettered"


class FakePublisher:
    """Records the fate copies sent to the DLX service; refuses all when ``down``."""

    def __init__(self) -> None:
        self.sent: list[Outgoing] = []
        self.down = False

    def publish(self, message: Outgoing) -> None:
        if self.down:
            raise ConnectionError("broker down")
        self.sent.append(message)


class FakeCauses:
    """Records the retry marks; every mark raises as Redis that does not answer when ``down``."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, list[str]]] = []
        self.down = False

    def _mark(self, kind: str, retries: Sequence[tuple[str, str, int, str]]) -> None:
        if self.down:
            raise redis.ConnectionError("redis down")
        self.marks.append((kind, [message_id for _, message_id, _, _ in retries]))

    def mark_pending_many(
        self, retries: Sequence[tuple[str, str, int, str]], ttl_seconds: float
    ) -> None:
        self._mark("pending", retries)

    def mark_copied_many(self, retries: Sequence[tuple[str, str, int, str]]) -> None:
        self._mark("made", retries)


class FakeRuntime:
    """Parks fail for the message ids in ``bad_parks``, publishes for ``bad_copies``;
    ``broken`` makes the named write raise as a whole; ``unrecorded`` names the confirmed
    requeues whose record fails."""

    history_optional = False

    def __init__(
        self,
        bad_parks: set[str] = frozenset(),
        bad_copies: set[str] = frozenset(),
        broken: str = "",
    ) -> None:
        self.bad_parks, self.bad_copies, self.broken = bad_parks, bad_copies, broken
        self.calls: list[tuple[str, list[str]]] = []
        self.node: str | None = None
        self.nodes: list[str | None] = []
        self.config = SimpleNamespace(exchange="celery_dlx")
        self.publisher = FakePublisher()
        self.causes = FakeCauses()
        self.unrecorded: set[str] = set()
        self.resets = 0

    def reset_publisher(self) -> None:
        self.resets += 1

    @contextlib.contextmanager
    def acting_for(self, node: str | None) -> Iterator[None]:
        self.node = node
        yield
        self.node = None

    def park_recorded_many(
        self, parks: Sequence[tuple[ParkedMessage, FateEvent]]
    ) -> list[BaseException | None]:
        self.calls.append(("park", [m.message_id for m, _ in parks]))
        self.nodes.append(self.node)
        if self.broken == "park":
            raise ConnectionError("redis down")
        return [
            RuntimeError("refused") if m.message_id in self.bad_parks else None for m, _ in parks
        ]

    def requeue_recorded_many(
        self,
        requeues: Sequence[tuple[Outgoing, FateEvent]],
        *,
        unrecorded: Callable[[Sequence[FateEvent]], None] | None = None,
    ) -> list[BaseException | None]:
        self.calls.append(("requeue", [e.message_id for _, e in requeues]))
        self.nodes.append(self.node)
        if self.broken == "requeue":
            raise ConnectionError("broker down")
        outcomes: list[BaseException | None] = [
            PublishError("nacked") if e.message_id in self.bad_copies else None for _, e in requeues
        ]
        missing = [e for (_, e), o in zip(requeues, outcomes, strict=True) if o is None]
        missing = [e for e in missing if e.message_id in self.unrecorded]
        if missing and unrecorded is not None:
            unrecorded(missing)
        return outcomes


def _event(fate: str, message_id: str) -> FateEvent:
    return FateEvent.of(fate, Failure(task="t", queue="q", message_id=message_id, attempt=1))


def _park(message_id: str) -> ParkHandover:
    message = ParkedMessage(message_id=message_id, attempt=1, queue="q", body=b"{}")
    return ParkHandover(message, _event(PARKED, message_id))


def _requeue(message_id: str) -> RequeueHandover:
    copy = Outgoing(body=b"{}", routing_key="q")
    return RequeueHandover(copy, _event(REQUEUED, message_id))


def _settle(runtime: FakeRuntime, handovers: list[Any], monkeypatch: Any) -> list[str | None]:
    monkeypatch.setattr(settler_module, "get_runtime", lambda app: runtime)
    settler = Settler(Celery(set_as_current=False), hostname="w1@host")
    requests = [FakeRequest() for _ in handovers]
    settler._settle(list(zip(requests, handovers, strict=True)))  # type: ignore[arg-type]
    return [r.outcome for r in requests]


def test_parks_and_requeues_of_one_batch_are_written_once_each_and_acked_in_place(
    monkeypatch: Any,
) -> None:
    runtime = FakeRuntime(bad_parks={"p2"}, bad_copies={"r1"})
    handovers = [_requeue("r1"), _park("p1"), _requeue("r2"), _park("p2"), _requeue("r3")]
    outcomes = _settle(runtime, handovers, monkeypatch)
    assert runtime.calls == [("park", ["p1", "p2"]), ("requeue", ["r1", "r2", "r3"])]
    assert runtime.nodes == ["w1@host", "w1@host"]  # their events name the worker
    # r1's copy was not confirmed, p2's park failed: each went to the DLX service naming its
    # fate, and the original was acked; nothing was rejected into the dead-letter exchange
    assert outcomes == ["acked"] * 5
    sent = {m.headers[FATE_HEADER]: m for m in runtime.publisher.sent}
    assert sorted(sent) == [PARKED, REQUEUED]
    assert all(m.exchange == "celery_dlx" and m.routing_key == "q" for m in sent.values())
    assert sent[PARKED].headers[DELAY_HEADER] == "0.000"


@pytest.mark.parametrize("broken", ["park", "requeue"])
def test_a_write_that_raises_falls_back_for_its_own_kind_only(
    broken: str, monkeypatch: Any
) -> None:
    runtime = FakeRuntime(broken=broken)
    outcomes = _settle(runtime, [_park("p1"), _requeue("r1"), _park("p2")], monkeypatch)
    assert outcomes == ["acked", "acked", "acked"]
    expected = [PARKED, PARKED] if broken == "park" else [REQUEUED]
    assert [m.headers[FATE_HEADER] for m in runtime.publisher.sent] == expected


def test_a_copy_the_broker_refuses_too_goes_back_to_its_queue(monkeypatch: Any) -> None:
    """Never into the dead-letter exchange: the DLX service would read that as a burial."""
    runtime = FakeRuntime(broken="park")
    runtime.publisher.down = True
    outcomes = _settle(runtime, [_park("p1"), _requeue("r1")], monkeypatch)
    assert outcomes == ["requeued", "acked"]
    assert runtime.resets == 1


def test_requeued_copies_go_out_only_after_their_retries_are_marked_pending(
    monkeypatch: Any,
) -> None:
    """A redelivery of an original whose copy went out (its ack lost) then waits for the
    marker instead of starting a second lineage; a copy whose record failed is marked made."""
    runtime = FakeRuntime(broken="park")
    runtime.unrecorded = {"r2"}
    outcomes = _settle(runtime, [_requeue("r1"), _park("p1"), _requeue("r2")], monkeypatch)
    assert outcomes == ["acked"] * 3
    assert runtime.causes.marks == [
        ("pending", ["r1", "r2"]),  # before the requeue batch's publish
        ("made", ["r2"]),  # its history entry (which carries the marker) was refused
        ("pending", ["p1"]),  # p1's park failed: marked before its copy goes to the service
        ("made", ["p1"]),
    ]


def test_through_a_redis_outage_copies_go_out_unmarked(monkeypatch: Any) -> None:
    """Redis does not answer the pending marks past this process's patience: the copies go out
    unmarked and the originals are acked, so the work goes on through a long outage."""
    monkeypatch.setitem(marks._outage, "spent", True)  # patience spent: one try each
    runtime = FakeRuntime(broken="park")
    runtime.causes.down = True
    outcomes = _settle(runtime, [_park("p1"), _requeue("r1")], monkeypatch)
    assert outcomes == ["acked", "acked"]
    assert [m.headers[FATE_HEADER] for m in runtime.publisher.sent] == [PARKED]
    assert runtime.calls == [("park", ["p1"]), ("requeue", ["r1"])]
    assert runtime.causes.marks == []


def test_patience_is_spent_once_per_outage(monkeypatch: Any) -> None:
    """A Redis restart is waited for; through a long outage each process waits once, then
    tries each write once until one succeeds."""
    monkeypatch.setitem(marks._outage, "spent", False)
    monkeypatch.setattr(marks.time, "sleep", lambda seconds: None)
    clock = iter(range(0, 10_000))
    monkeypatch.setattr(marks.time, "monotonic", lambda: float(next(clock)))
    tries: list[int] = []

    def down() -> None:
        tries.append(1)
        raise redis.ConnectionError("down")

    with pytest.raises(redis.ConnectionError):
        marks.patiently(down, patience=5)
    assert len(tries) > 1 and marks._outage["spent"]
    tries.clear()
    with pytest.raises(redis.ConnectionError):
        marks.patiently(down, patience=5)
    assert len(tries) == 1  # spent: one try
    assert marks.patiently(lambda: "up", patience=5) == "up"
    assert not marks._outage["spent"]  # answered: the next outage is waited for again
