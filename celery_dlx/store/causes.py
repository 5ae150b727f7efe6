"""Cause records in Redis: what a worker knows about a burial that the dead letter cannot carry.

A task buried by reject reaches the DLX service as the original message: the exception and
attempt history live only in the worker, which stashes a
:class:`~celery_dlx.message.cause.CauseRecord` here by message id before it rejects; the DLX
service takes it (:class:`~celery_dlx.store.seen.Letters`) when it writes the obituary. The
worker also notes the copies it requeued itself, so a redelivery of the original is not counted
as a crash.
"""

from __future__ import annotations

from collections.abc import Sequence

from celery_dlx.message.cause import CauseRecord
from celery_dlx.message.lineage import same_lineage
from celery_dlx.message.names import Keys
from celery_dlx.store.client import RedisClient, text
from celery_dlx.store.errors import RetryPending
from celery_dlx.store.history import COPIED_TTL_MS

#: The value of a retry step's run marker once a run of it succeeded.
RUN_DONE = "done"
#: A retry marker's value while the copy is on its way to the DLX service (then its lineage).
PENDING_MARK = "pending|"


class Causes:
    """The ``Causes`` role in Redis: stashed cause records and own-requeue markers."""

    def __init__(self, client: RedisClient, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def stash(self, message_id: str, record: CauseRecord, ttl_seconds: float) -> None:
        self.client.set(self.keys.cause(message_id), record.to_json(), px=int(ttl_seconds * 1000))

    def read(self, message_id: str) -> CauseRecord | None:
        """The stashed record for ``message_id``, or None (also when unreadable)."""
        return CauseRecord.from_json(self.client.get(self.keys.cause(message_id)))

    def drop(self, message_id: str) -> None:
        """Forget the record once the obituary holding it is written."""
        self.client.delete(self.keys.cause(message_id))

    def note_requeue(self, message_id: str, ttl_seconds: int) -> None:
        """Remember that this worker published the requeue copy of ``message_id``."""
        self.client.set(self.keys.requeued_by_task(message_id), 1, ex=ttl_seconds)

    def was_copied(self, queue: str, message_id: str, attempt: int, lineage: str) -> bool:
        """Whether the retry of ``message_id`` at ``attempt`` in ``queue`` exists, made from a
        delivery of ``lineage``: its marker was written with its fate
        (:func:`~celery_dlx.store.history.mark_copies`) or :meth:`mark_copied_many`.

        Raises:
            RetryPending: its copy is on its way (:meth:`mark_pending_many`).
        """
        marker = self.client.get(self.keys.copied(queue, message_id, attempt))
        if marker is None:
            return False
        value = text(marker)
        if value.startswith(PENDING_MARK):
            if same_lineage(value.removeprefix(PENDING_MARK), lineage):
                raise RetryPending(f"the retry of {message_id} at attempt {attempt} is pending")
            return False
        return same_lineage(value, lineage)

    def mark_pending_many(
        self, retries: Sequence[tuple[str, str, int, str]], ttl_seconds: float
    ) -> None:
        """Note, before their copies go out, that the retries ``(queue, message_id, attempt,
        lineage)`` may exist whatever the publish says: :meth:`was_copied` raises
        :class:`RetryPending` until a marker replaces the mark or ``ttl_seconds`` pass. Never
        replaces the marker of a retry that exists."""
        pipe = self.client.pipeline(transaction=False)
        for queue, message_id, attempt, lineage in retries:
            pipe.set(
                self.keys.copied(queue, message_id, attempt),
                PENDING_MARK + lineage,
                px=int(ttl_seconds * 1000),
                nx=True,
            )
        pipe.execute()

    def mark_copied_many(self, retries: Sequence[tuple[str, str, int, str]]) -> None:
        """Note that the retries ``(queue, message_id, attempt, lineage)`` exist (copies out)."""
        pipe = self.client.pipeline(transaction=False)
        for queue, message_id, attempt, lineage in retries:
            pipe.set(self.keys.copied(queue, message_id, attempt), lineage, px=COPIED_TTL_MS)
        pipe.execute()

    def claim_run(self, step: str, ttl_seconds: float) -> bool:
        """Note that the retry step ``step`` starts running; False when a run of it started
        before (a duplicate copy)."""
        return bool(self.client.set(self.keys.run(step), 1, nx=True, px=int(ttl_seconds * 1000)))

    def finish_run(self, step: str, ttl_seconds: float) -> None:
        """Note that a run of ``step`` succeeded (:meth:`run_finished`)."""
        self.client.set(self.keys.run(step), RUN_DONE, px=int(ttl_seconds * 1000))

    def run_finished(self, step: str) -> bool:
        return self.client.get(self.keys.run(step)) == RUN_DONE.encode()

    def take_requeue(self, message_id: str) -> bool:
        """Whether a requeue of ``message_id`` was noted (and forget it)."""
        return bool(self.client.delete(self.keys.requeued_by_task(message_id)))


def stash_cause(
    client: RedisClient, keys: Keys, message_id: str, record: CauseRecord, ttl_seconds: float
) -> None:
    Causes(client, keys).stash(message_id, record, ttl_seconds)


def read_cause(client: RedisClient, keys: Keys, message_id: str) -> CauseRecord | None:
    return Causes(client, keys).read(message_id)
