"""Reading the failure history into Spark: Redis stream id ranges read by the executors, or a
JSON-lines snapshot.

This module is the only part of the job the executors import, so it needs nothing but the
standard library and redis-py (hiredis, when installed, makes redis-py parse replies ~6x faster).
It must not import celery or celery_dlx: executors on a cluster do not have them.

Both sources produce the same *raw* frame: one string column per history field (``RAW_COLUMNS``),
an empty or null string for a missing field, and ``_corrupt`` holding a snapshot line that is not
JSON. Validation happens afterwards, in the JVM (``dlx_records``).
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Iterator
from typing import Any

#: Fields of a history entry (``celery_dlx.store.history.HISTORY_FIELDS`` plus ``obituary``).
HISTORY_FIELDS = (
    "fate",
    "at_ms",
    "queue",
    "task",
    "message_id",
    "attempt",
    "cause",
    "exc_type",
    "reason",
    "delay",
    "importance",
    "first_failure_ms",
    "obituary",
)
#: Columns of the raw frame: the stream id, the fields, and the text of a snapshot line that
#: could not be parsed as JSON.
RAW_COLUMNS = ("id", *HISTORY_FIELDS, "_corrupt")

#: Largest sequence part of a stream id (Redis ids are two unsigned 64-bit integers).
MAX_SEQ = 2**64 - 1

#: Separators of the page blobs executors hand to the JVM: ASCII record and unit separators.
#: One string per page instead of one tuple per entry makes the Python -> JVM hop ~2x cheaper.
RECORD_SEP = "\x1e"
UNIT_SEP = "\x1f"
_RECORD_SEP_B = RECORD_SEP.encode()
_UNIT_SEP_B = UNIT_SEP.encode()
_REPLACEMENT_B = "\ufffd".encode()
_FIELD_KEYS_B = tuple(name.encode() for name in HISTORY_FIELDS)


def history_key(prefix: str) -> str:
    """The history stream's key for a celery_dlx key prefix (``Keys(prefix).history``)."""
    return "{" + prefix + "}:history"


def connect(url: str) -> Any:
    """A redis-py client for ``url``: ``redis://``, ``rediss://``, ``unix://``,
    ``sentinel://host:port[,host:port]/service[/db]`` or ``redis://...?cluster=true``.

    Mirrors ``celery_dlx.store.parking.redis_client``, which executors cannot import.

    Raises:
        ValueError: a sentinel URL without a service name.
    """
    from urllib.parse import parse_qs, urlparse

    import redis

    parsed = urlparse(url)
    if parsed.scheme in ("sentinel", "sentinels"):
        from redis.sentinel import Sentinel

        hosts = []
        for part in parsed.netloc.split("@")[-1].split(","):
            host, _, port = part.partition(":")
            hosts.append((host or "127.0.0.1", int(port or 26379)))
        path = [p for p in parsed.path.split("/") if p]
        if not path:
            raise ValueError(f"--redis-url: a sentinel URL needs a service name: {url}")
        password = parsed.password
        sentinel = Sentinel(  # type: ignore[no-untyped-call]  # redis 8 leaves Sentinel unannotated
            hosts,
            socket_timeout=30.0,
            password=password,
            sentinel_kwargs={"password": password} if password else None,
        )
        db = int(path[1]) if len(path) > 1 else 0
        return sentinel.master_for(path[0], db=db, socket_timeout=30.0)  # type: ignore[no-untyped-call]
    if parse_qs(parsed.query).get("cluster", ["false"])[0].lower() in ("1", "true", "yes"):
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(url.split("?", 1)[0])
    return redis.Redis.from_url(url, socket_timeout=60.0, socket_connect_timeout=10.0)


def parse_id(entry_id: str | bytes) -> tuple[int, int]:
    """``"1700000000000-3"`` -> ``(1700000000000, 3)``.

    Raises:
        ValueError: not a full stream id.
    """
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, sep, seq = text.partition("-")
    if not sep or not ms.isdigit() or not seq.isdigit():
        raise ValueError(f"not a stream id: {text!r}")
    return int(ms), int(seq)


def format_id(ms: int, seq: int) -> str:
    return f"{ms}-{seq}"


def split_ranges(
    after: str | None, first_id: str, last_id: str, count: int
) -> list[tuple[str, str]]:
    """Split the stream entries after ``after`` (exclusive) up to ``last_id`` (inclusive) into at
    most ``count`` disjoint XRANGE ranges by the millisecond part of their ids.

    Args:
        after: the checkpoint (last exported id), or None to start at ``first_id``.
        first_id: the stream's first entry id.
        last_id: the stream's last entry id when the export started; later entries wait for the
            next export.
        count: ranges wanted (fewer when the ids span fewer milliseconds).

    Returns:
        ``(start, end)`` pairs for XRANGE; the first start is ``(after`` (exclusive), the last end
        is ``last_id``. Empty when nothing is newer than ``after``.
    """
    last_ms, _ = parse_id(last_id)
    start_ms, _ = parse_id(first_id)
    first_start = first_id
    if after is not None:
        if parse_id(after) >= parse_id(last_id):
            return []
        start_ms = max(start_ms, parse_id(after)[0])
        first_start = "(" + after
    span = last_ms - start_ms + 1
    count = max(1, min(count, span))
    bounds = [start_ms + (i * span) // count for i in range(count)] + [last_ms + 1]
    ranges = []
    for i in range(count):
        start = first_start if i == 0 else format_id(bounds[i], 0)
        end = last_id if i == count - 1 else format_id(bounds[i + 1] - 1, MAX_SEQ)
        ranges.append((start, end))
    return ranges


#: An XRANGE entry: its id and its fields, as a flat ``[name, value, name, value...]`` list (the
#: reply as hiredis parsed it) or as a dict (a client that applied redis-py's XRANGE callback).
RawEntry = tuple[bytes, list[bytes] | dict[bytes, bytes]]


@functools.lru_cache(maxsize=64)
def _values_getter(names: tuple[bytes, ...]) -> Callable[[list[bytes]], tuple[bytes, ...]]:
    """For entries whose field names come in this order, a function picking the values of
    ``HISTORY_FIELDS`` from the flat list (missing ones empty). Entries written by one version of
    celery_dlx share one order, so this is computed once per page or so."""
    position = {name: 2 * i + 1 for i, name in enumerate(names)}  # a repeated name: last wins
    picks = [position.get(key) for key in _FIELD_KEYS_B]
    if None not in picks:
        return operator.itemgetter(*picks)
    return lambda flat: tuple(b"" if i is None else flat[i] for i in picks)


def _flat(fields: list[bytes] | dict[bytes, bytes]) -> list[bytes]:
    """An entry's fields as a flat ``[name, value, ...]`` list. The reply's own list unless a
    callback made it a dict: a ``RedisCluster`` runs its nodes' XRANGE callbacks, whatever its
    own ``set_response_callback`` says."""
    if isinstance(fields, dict):
        return [item for pair in fields.items() for item in pair]
    return fields


def encode_page(rows: list[RawEntry]) -> str:
    """One XRANGE page as a blob: entries joined by ``RECORD_SEP``, each the id and the fields of
    ``HISTORY_FIELDS`` joined by ``UNIT_SEP`` (a missing field is empty).

    Separator characters inside a value (never written by celery_dlx) become U+FFFD so a hostile
    value cannot shift the columns; undecodable UTF-8 becomes U+FFFD too.
    """
    flats = [(entry_id, _flat(fields)) for entry_id, fields in rows]
    records = [
        _UNIT_SEP_B.join((entry_id, *_values_getter(tuple(flat[0::2]))(flat)))
        for entry_id, flat in flats
    ]
    blob = _RECORD_SEP_B.join(records)
    expected_units = len(records) * len(HISTORY_FIELDS)
    if blob.count(_UNIT_SEP_B) != expected_units or blob.count(_RECORD_SEP_B) != len(records) - 1:
        blob = _RECORD_SEP_B.join(
            _UNIT_SEP_B.join(
                [_clean(entry_id), *map(_clean, _values_getter(tuple(flat[0::2]))(flat))]
            )
            for entry_id, flat in flats
        )
    return blob.decode("utf-8", "replace")


def _raw_reply(response: Any, **options: Any) -> Any:
    return response


def _clean(value: bytes) -> bytes:
    return value.replace(_RECORD_SEP_B, _REPLACEMENT_B).replace(_UNIT_SEP_B, _REPLACEMENT_B)


def read_ranges(
    url: str, key: str, page_size: int, counter: Any, ranges: Iterator[tuple[str, str]]
) -> Iterator[str]:
    """Executor side: read each ``(start, end)`` range with paged XRANGE and yield page blobs.

    Args:
        url: Redis URL (see :func:`connect`).
        key: the history stream key.
        page_size: XRANGE COUNT per round trip.
        counter: a Spark accumulator counting entries read (progress only).
        ranges: this partition's ranges.
    """
    client = connect(url)
    # keep XRANGE replies as hiredis parsed them: redis-py's dict per entry costs more than
    # the rest of the executor's work on it
    client.set_response_callback("XRANGE", _raw_reply)
    try:
        for start, end in ranges:
            cursor: str | bytes = start
            while True:
                rows = client.xrange(key, cursor, end, count=page_size)
                if not rows:
                    break
                counter.add(len(rows))
                yield encode_page(rows)
                if len(rows) < page_size:
                    break
                last = rows[-1][0]
                cursor = b"(" + last if isinstance(last, bytes) else "(" + str(last)
    finally:
        client.close()


def _raw_from_blobs(blobs: Any) -> Any:
    """The raw frame from a frame of page blobs (column ``value``)."""
    from pyspark.sql import functions as F

    records = blobs.select(F.explode(F.split("value", RECORD_SEP, -1)).alias("record"))
    parts = records.select(F.split("record", UNIT_SEP, -1).alias("parts"))
    columns = [F.get("parts", i).alias(name) for i, name in enumerate(RAW_COLUMNS[:-1])]
    return parts.select(*columns, F.lit(None).cast("string").alias("_corrupt"))


def redis_frame(
    spark: Any, url: str, key: str, ranges: list[tuple[str, str]], page_size: int, counter: Any
) -> Any:
    """The raw frame of the given stream ranges, one Spark partition per range; the driver never
    reads an entry."""
    rdd = spark.sparkContext.parallelize(ranges, max(1, len(ranges)))
    blobs = rdd.mapPartitions(functools.partial(read_ranges, url, key, page_size, counter))
    return _raw_from_blobs(spark.createDataFrame(blobs, "string"))


def snapshot_frame(spark: Any, path: str) -> Any:
    """The raw frame of a JSON-lines snapshot (one object per line: ``id`` plus the history
    fields, as :func:`snapshot_line` writes). Read by Spark's own JSON reader, split by file."""
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField(name, T.StringType()) for name in RAW_COLUMNS])
    reader = spark.read.schema(schema).option("mode", "PERMISSIVE")
    return reader.option("columnNameOfCorruptRecord", "_corrupt").json(path)


def snapshot_line(entry_id: str, fields: dict[str, str]) -> str:
    """One snapshot line for a history entry (the format :func:`snapshot_frame` reads)."""
    return json.dumps({"id": entry_id, **fields}, separators=(",", ":"), ensure_ascii=False)
