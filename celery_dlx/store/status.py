"""What became of a buried message after it was replayed: the obituary's status.

An obituary is ``unresolved`` until replayed; then ``replayed``, and either ``resolved`` (the
copy ran, or nothing dead-lettered it within ``dlx_resolve_after``) or ``failed-again`` (the new
obituary names the old one and counts the repeats). Resolved obituaries leave the graveyard
after ``dlx_resolved_retention``; their history stays.

Per shard: a hash ``status`` (obituary id -> JSON ``{"s": status, "at": ms, ...}``; none for an
unresolved obituary never replayed), the zsets ``replayed`` and ``resolved`` (id -> when), and
per cause the counts ``n_replayed``, ``n_resolved`` and ``n_failed-again`` in its group hash, so
a cause says how many of its messages were resolved without reading them.
"""

from __future__ import annotations

from celery_dlx.message.status import (
    COUNTED,
    FAILED_AGAIN,
    REPLAYED,
    RESOLVED,
    STATUSES,
    UNRESOLVED,
    parse,
    status_of,
)

__all__ = [
    "COUNTED",
    "FAILED_AGAIN",
    "FORGET_STATUS",
    "REPLAYED",
    "RESOLVED",
    "SET_STATUS",
    "STATUSES",
    "UNRESOLVED",
    "parse",
    "status_of",
]

# KEYS: status replayed resolved group records; ARGV: id status at extra-json allowed-from.
# Moves one obituary (if it is still there) to ``status``, merging ``extra`` into its document,
# when its current status is one of ``allowed-from`` (comma-separated; "" any); keeps the counts
# of its cause's group and the replayed/resolved indexes in step. Returns 1 if changed.
SET_STATUS = """
if redis.call('HEXISTS', KEYS[5], ARGV[1]) == 0 then return 0 end
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local doc = {}
if raw then doc = cjson.decode(raw) end
local old = doc.s or 'unresolved'
if ARGV[5] ~= '' and not string.find(',' .. ARGV[5] .. ',', ',' .. old .. ',', 1, true) then
  return 0
end
for k, v in pairs(cjson.decode(ARGV[4])) do doc[k] = v end
doc.s = ARGV[2]
doc.at = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(doc))
if old ~= ARGV[2] then
  if old ~= 'unresolved' then redis.call('HINCRBY', KEYS[4], 'n_' .. old, -1) end
  if ARGV[2] ~= 'unresolved' then redis.call('HINCRBY', KEYS[4], 'n_' .. ARGV[2], 1) end
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if ARGV[2] == 'replayed' then redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1]) end
if ARGV[2] == 'resolved' then redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1]) end
return 1
"""

# The part of the removal script (store/graveyard.py) that forgets an obituary's status:
# KEYS[16] status, KEYS[17] replayed, KEYS[18] resolved, KEYS[8] its group; ARGV[1] its id.
FORGET_STATUS = """
local st = redis.call('HGET', KEYS[16], ARGV[1])
if st then
  local s = cjson.decode(st).s
  if s and s ~= 'unresolved' then redis.call('HINCRBY', KEYS[8], 'n_' .. s, -1) end
  redis.call('HDEL', KEYS[16], ARGV[1])
end
redis.call('ZREM', KEYS[17], ARGV[1])
redis.call('ZREM', KEYS[18], ARGV[1])
"""
