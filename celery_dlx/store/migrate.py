"""``dlx migrate-keys``: move what the single-tag layout holds to the keys of each queue.

Per entry: copy it to its queue's shard (nothing if it is there), then delete the original only
if it is unchanged; interrupted anywhere, a run again finishes the job and loses nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from celery_dlx.message.obituary import Obituary
from celery_dlx.message.parked import ParkedMessage

if TYPE_CHECKING:
    from celery_dlx.store.graveyard import Graveyard
    from celery_dlx.store.parking import ParkingStore

logger = logging.getLogger(__name__)


@dataclass
class Migration:
    """What a migration did (or, dry, would do): entries ``found`` under the app's tag,
    ``copied`` to their queue's keys, ``present`` there already, ``moved`` (deleted after their
    copy), ``left`` in place (unreadable, or claimed by a drain meanwhile), ``gone`` (obituaries
    purged or swept meanwhile; their copy too), and found per queue (``queues``)."""

    found: int = 0
    copied: int = 0
    present: int = 0
    moved: int = 0
    left: int = 0
    gone: int = 0
    queues: dict[str, int] = field(default_factory=dict)

    def saw(self, queue: str) -> None:
        self.queues[queue] = self.queues.get(queue, 0) + 1


def migrate_parked(store: ParkingStore, *, dry_run: bool = False, batch: int = 500) -> Migration:
    """Move parked retries from the app's tag to their queues' buckets, soonest first (one a
    drain claims between copy and delete is drained from both: at-least-once)."""
    result = Migration()
    home = store.shards.home
    start = 0
    while True:
        rows = home.page(start, batch)
        if not rows:
            return result
        moved_before = result.moved
        for entry_id, score, meta, body in rows:
            result.found += 1
            try:
                queue = ParkedMessage.from_stored(meta, b"").queue if meta is not None else None
            except (ValueError, TypeError, KeyError):
                queue = None
            if queue is None:
                logger.error("parked entry %r has unreadable metadata; left in place", entry_id)
                result.left += 1
                continue
            result.saw(queue)
            if dry_run:
                continue
            store.shards.add_queues([queue])
            (copied,) = store.shard(queue, entry_id).put(
                [entry_id, score, meta, body or b""], f"the copy of parked entry {entry_id!r}"
            )
            if copied:
                result.copied += 1
            else:
                result.present += 1
            if home.delete_if_scored([(entry_id, score)]):
                result.moved += 1
            else:
                result.left += 1
        # Deleted entries shift the ranks: read on after the ones left in place.
        start += len(rows) - (result.moved - moved_before)
        if len(rows) < batch:
            return result


def migrate_graveyard(yard: Graveyard, *, dry_run: bool = False, batch: int = 100) -> Migration:
    """Move obituaries from the app's tag to their queues' buckets, oldest first, without a
    history entry (nothing left the graveyard). A moved cause's lifetime ``total`` restarts at
    the obituaries moved; its first-seen time is its oldest obituary's."""
    result = Migration()
    home = yard.shards.home
    skip = 0
    while True:
        stored = home.stored_page(skip, batch)
        if not stored:
            return result
        for oid, raw, payload, ledger in stored:
            result.found += 1
            try:
                ob = Obituary.from_record(raw, None) if raw is not None else None
            except (ValueError, TypeError):
                ob = None
            if ob is None:
                logger.error("obituary %s has an unreadable record; left in place", oid)
                result.left += 1
                skip += 1
                continue
            result.saw(ob.queue)
            if dry_run:
                skip += 1
                continue
            yard.shards.add_queues([ob.queue])
            target = yard.shard(ob.queue, ob.id)
            if target.copy_in(ob, raw, payload or b"", ledger):
                result.copied += 1
            else:
                result.present += 1
            if home.remove(ob, None):
                result.moved += 1
            else:  # purged or swept meanwhile (with its history entry): it stays gone
                target.remove(ob, None)
                result.gone += 1
        if len(stored) < batch:
            return result
