"""The DLX service's ledger of dead letters it has given a fate, and its batch lookup.

A dead letter redelivered after a crash (its batch settled, not yet acked) must get no second
fate: each settled letter leaves a marker (``seen:<letter key>``) for :data:`SEEN_TTL_MS`.
"""

from __future__ import annotations

from collections.abc import Sequence

from celery_dlx.message.cause import CauseRecord
from celery_dlx.message.names import Keys
from celery_dlx.store.client import RedisClient, mget_many

#: How long a handled dead letter's key is remembered, to ack a redelivery without a second fate.
SEEN_TTL_MS = 24 * 3600 * 1000

# Set the first ARGV[2] keys of KEYS with a time to live of ARGV[1] ms (the batch's "handled"
# markers) and delete the rest (the workers' cause records of the letters it buried), in one step:
# a settle retried after a failure finds both or neither.
_MARK_SEEN = """
local marks = tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  if i <= marks then redis.call('SET', key, '1', 'PX', ARGV[1]) else redis.call('DEL', key) end
end
return marks
"""


class Letters:
    """Seen markers of settled dead letters, and the cause records the workers stashed."""

    def __init__(self, client: RedisClient, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._mark = client.register_script(_MARK_SEEN)

    def lookup(
        self, letter_keys: Sequence[str], identities: Sequence[str]
    ) -> tuple[list[bool], list[CauseRecord | None]]:
        """Which letters were settled before, and the cause record of each identity."""
        seen, records = mget_many(
            self.client,
            [self.keys.seen(k) for k in letter_keys],
            [self.keys.cause(i) for i in identities],
        )
        return [m is not None for m in seen], [CauseRecord.from_json(r) for r in records]

    def mark(
        self,
        letter_keys: Sequence[str],
        ttl_ms: int = SEEN_TTL_MS,
        *,
        drop_causes: Sequence[str] = (),
    ) -> None:
        """Remember that these letters were settled (for ``ttl_ms``) and, in the same step,
        forget the cause records of ``drop_causes`` (their obituaries are written)."""
        keys = [self.keys.seen(k) for k in letter_keys]
        keys += [self.keys.cause(i) for i in drop_causes]
        if keys:
            self._mark(keys=keys, args=[ttl_ms, len(letter_keys)])
