"""ConfirmingPublisher's confirm bookkeeping: single and multiple acks/nacks, in any mix."""

from __future__ import annotations

from collections import deque

from celery_dlx.broker.publish import ConfirmingPublisher


def publisher_with(tags: list[int]) -> ConfirmingPublisher:
    publisher = ConfirmingPublisher(connection=None)  # type: ignore[arg-type]  # no I/O here
    publisher._pending = set(tags)
    publisher._order = deque(tags)
    return publisher


def test_single_and_multiple_confirms_settle_each_tag_once() -> None:
    publisher = publisher_with(list(range(1, 11)))
    publisher._on_ack(3, False)
    publisher._on_nack(5, False)
    publisher._on_ack(6, True)  # 1, 2, 4, 6; not 3 and 5 again
    assert publisher._pending == {7, 8, 9, 10}
    publisher._on_nack(8, True)
    publisher._on_ack(10, False)
    publisher._on_ack(9, True)
    assert publisher._pending == set()
    assert publisher._acked == {
        1: True, 2: True, 3: True, 4: True, 5: False, 6: True,
        7: False, 8: False, 9: True, 10: True,
    }  # fmt: skip


def test_a_multiple_confirm_below_every_pending_tag_settles_nothing() -> None:
    publisher = publisher_with([4, 5])
    publisher._on_ack(3, True)
    assert publisher._pending == {4, 5}
    assert publisher._acked == {}
