"""Aggregates of the exported history: what fails, why, how often retries rescue it, how fast.

Per group (``day, queue, task, cause`` for the Parquet output):

* ``failures`` = requeued + parked + buried events (every failed attempt ends in one of them);
  ``requeues``, ``parks``, ``burials``, ``replays`` count their fates.
* ``failed_messages``: distinct message ids with a failure event in the group;
  ``recovered_messages``: those of them that have a ``recovered`` event (at any time);
  ``retry_success_rate`` = recovered_messages / failed_messages.
* ``ttr_p50_s``/``ttr_p95_s``: exact percentiles (linear interpolation) of the time to recovery of
  the group's recovered messages: the first ``recovered`` event's ``at_ms`` minus its
  ``first_failure_ms`` (or, when that is empty, the message's first failure event).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery_dlx_spark.records import FAILURE_FATES

#: Group keys of the aggregates output.
DAY_KEYS = ("day", "queue", "task", "cause")
#: Group keys of the printed summary (the whole exported history).
SUMMARY_KEYS = ("queue", "task", "cause")
#: Columns of an aggregate row after its keys.
MEASURES = (
    "exc_type",
    "failures",
    "requeues",
    "parks",
    "burials",
    "replays",
    "failed_messages",
    "recovered_messages",
    "retry_success_rate",
    "ttr_p50_s",
    "ttr_p95_s",
)


def _count(fate: str) -> Any:
    from pyspark.sql import functions as F

    return F.sum(F.when(F.col("fate") == fate, 1).otherwise(0))


def message_facts(events: Any) -> Any:
    """One row per day, queue, task, cause and message with a failure or a replay: its fate
    counts, whether it failed there, the first and last of its failures there
    (``failed_from``, ``failed_to``), and (per message) whether and how fast it recovered.

    Every aggregate is a grouping of these rows. The events are shuffled once, by message; the
    rows per group, the recovery per message (a window over the message's rows) and the
    summary's groupings by message of the (persisted) result all keep that partitioning.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    failure = F.col("fate").isin(*FAILURE_FATES)
    recovery = F.col("fate") == "recovered"
    at_ms = F.col("at_ms")
    # the one shuffle: every event the facts read, by message
    by_message = events.filter(failure | recovery | (F.col("fate") == "replayed")).repartition(
        "message_id"
    )
    # message_id first: the rows come out sorted by message, as the window below needs them
    per_group = by_message.groupBy("message_id", *DAY_KEYS).agg(
        F.max(F.when(failure & (F.col("exc_type") != ""), F.col("exc_type"))).alias("exc_type"),
        _count("requeued").alias("requeues"),
        _count("parked").alias("parks"),
        _count("buried").alias("burials"),
        _count("replayed").alias("replays"),
        F.max(F.when(failure, 1).otherwise(0)).alias("failed"),
        F.min(F.when(failure, at_ms)).alias("failed_from"),
        F.max(F.when(failure, at_ms)).alias("failed_to"),
        F.min(F.when(recovery, at_ms)).alias("recovered_at"),
        F.min_by("first_failure_ms", F.when(recovery, at_ms)).alias("recovered_first_failure"),
    )
    # the time to recovery: the message's first recovered event's at_ms minus that event's
    # first_failure_ms, or, when that is empty, the message's first failure event (any day)
    message = Window.partitionBy("message_id")
    per_message = per_group.select(
        "*",
        F.min("recovered_at").over(message).alias("message_recovered_at"),
        F.min_by("recovered_first_failure", "recovered_at").over(message).alias("message_first"),
        F.min("failed_from").over(message).alias("message_failed_at"),
    )
    ttr = F.col("message_recovered_at") - F.coalesce("message_first", "message_failed_at")
    facts = per_message.select(
        *DAY_KEYS,
        "message_id",
        "exc_type",
        "requeues",
        "parks",
        "burials",
        "replays",
        "failed",
        "failed_from",
        "failed_to",
        F.when(ttr >= 0, ttr).alias("ttr_ms"),
        F.when(F.col("message_recovered_at").isNotNull(), 1).alias("recovered"),
    )
    # groups holding only recoveries counted for their message above; they are no group's facts
    return facts.filter((F.col("failed") == 1) | (F.col("replays") > 0))


def aggregate(facts: Any, keys: Sequence[str]) -> Any:
    """Aggregate rows (keys + ``MEASURES``) of :func:`message_facts`, one per group with a
    failure or a replay; ``keys`` may be empty (one row for everything)."""
    from pyspark.sql import functions as F

    keys = list(keys)
    if "day" not in keys:
        # a message failing on several days counts once per group, with its one recovery
        facts = facts.groupBy(*keys, "message_id").agg(
            F.max("exc_type").alias("exc_type"),
            *[F.sum(name).alias(name) for name in ("requeues", "parks", "burials", "replays")],
            F.max("failed").alias("failed"),
            F.max("recovered").alias("recovered"),
            F.max("ttr_ms").alias("ttr_ms"),
        )
    failed = F.col("failed") == 1
    ttr = F.when(failed, F.col("ttr_ms"))
    rows = facts.groupBy(*keys).agg(
        F.max("exc_type").alias("exc_type"),
        *[F.sum(name).alias(name) for name in ("requeues", "parks", "burials", "replays")],
        F.sum("failed").alias("failed_messages"),
        F.sum(F.when(failed & (F.col("recovered") == 1), 1).otherwise(0)).alias("recovered"),
        F.percentile(ttr, 0.5).alias("ttr_p50_ms"),
        F.percentile(ttr, 0.95).alias("ttr_p95_ms"),
    )
    failed_messages = F.col("failed_messages")
    return rows.select(
        *keys,
        "exc_type",
        (F.col("requeues") + F.col("parks") + F.col("burials")).alias("failures"),
        "requeues",
        "parks",
        "burials",
        "replays",
        failed_messages.cast("long").alias("failed_messages"),
        F.col("recovered").cast("long").alias("recovered_messages"),
        F.when(failed_messages > 0, F.col("recovered") / failed_messages).alias(
            "retry_success_rate"
        ),
        (F.col("ttr_p50_ms") / 1000.0).alias("ttr_p50_s"),
        (F.col("ttr_p95_ms") / 1000.0).alias("ttr_p95_s"),
    )


def top_causes(daily: Any, limit: int) -> Any:
    """The ``limit`` causes with most failures per day, queue and task, with their ``rank`` and
    ``share`` of that task's failures that day."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    group = Window.partitionBy("day", "queue", "task")
    ranked = daily.filter(F.col("failures") > 0).select(
        "day",
        "queue",
        "task",
        "cause",
        "exc_type",
        "failures",
        F.row_number().over(group.orderBy(F.col("failures").desc(), F.col("cause"))).alias("rank"),
        (F.col("failures") / F.sum("failures").over(group)).alias("share"),
    )
    return ranked.filter(F.col("rank") <= limit)


def summary_rows(facts: Any, limit: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The whole history's totals and its ``limit`` groups (queue, task, cause) with the most
    failures, as plain dicts."""
    from pyspark.sql import functions as F

    total_rows = aggregate(facts, ()).collect()
    totals = total_rows[0].asDict() if total_rows else {}
    ordered = aggregate(facts, SUMMARY_KEYS).orderBy(
        F.col("failures").desc(), F.col("queue"), F.col("task"), F.col("cause")
    )
    return totals, [row.asDict() for row in ordered.limit(limit).collect()]


def failure_bounds(facts: Any) -> tuple[Any, Any]:
    """The first and last failure's ``at_ms`` in :func:`message_facts` rows (None, None when
    nothing failed): the chart's window, without reading the events again."""
    from pyspark.sql import functions as F

    row = facts.agg(F.min("failed_from"), F.max("failed_to")).first()
    return (row[0], row[1]) if row is not None else (None, None)


def _cell(value: Any, column: str) -> str:
    if value is None:
        return "-"
    if column == "retry_success_rate":
        return f"{100 * value:.1f}%"
    if column.endswith("_s"):
        return f"{value:.1f}s"
    return str(value)


def format_table(totals: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """A fixed-width text table of summary rows, with a totals line."""
    columns = (
        ("queue", "queue"),
        ("task", "task"),
        ("cause", "cause"),
        ("exc_type", "exception"),
        ("failures", "fail"),
        ("requeues", "requeue"),
        ("parks", "park"),
        ("burials", "bury"),
        ("replays", "replay"),
        ("retry_success_rate", "rescued"),
        ("ttr_p50_s", "ttr p50"),
        ("ttr_p95_s", "ttr p95"),
    )
    body = [[_cell(row.get(name), name)[:40] for name, _ in columns] for row in rows]
    if totals:
        body.append(["ALL", "", "", ""] + [_cell(totals.get(n), n) for n, _ in columns[4:]])
    header = [title for _, title in columns]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(columns))]
    numeric = {i for i, (name, _) in enumerate(columns) if i >= 4 and name}

    def render(line: list[str]) -> str:
        cells = [
            cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i])
            for i, cell in enumerate(line)
        ]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([render(header), rule, *(render(line) for line in body)])
