"""Validation of raw history records, in the JVM: typed events and malformed records with reasons.

A record is malformed when its id is not a stream id, a required field is missing or empty, a
number does not parse or is out of range, its fate is unknown, or its obituary is not a JSON
object. Malformed records are kept whole (``raw``) with the first reason found; they are counted
and never stop an export.
"""

from __future__ import annotations

from typing import Any

from celery_dlx_spark.source import HISTORY_FIELDS

#: Kinds of history entry (``celery_dlx.fates.HISTORY_KINDS``): the fate changes and the console's audit.
FATES = (
    "requeued",
    "parked",
    "drained",
    "buried",
    "replayed",
    "purged",
    "recovered",
    "archived",
    "audit",
)
#: Fates that follow a failed attempt: every failure leads to exactly one of them.
FAILURE_FATES = ("requeued", "parked", "buried")
#: Fields a record cannot do without.
REQUIRED_FIELDS = ("fate", "at_ms", "queue", "message_id", "attempt")
#: Text fields that default to "" (foreign messages have no task, unknown causes are empty).
TEXT_FIELDS = ("task", "cause", "exc_type", "reason", "importance")
#: First millisecond of year 10000: later timestamps are bad numbers, not dates.
MAX_AT_MS = 253402300800000

#: Reason codes of malformed records.
BAD_LINE = "bad_json_line"
BAD_ID = "bad_id"
MISSING_FIELD = "missing_field"
BAD_NUMBER = "bad_number"
UNKNOWN_FATE = "unknown_fate"
BAD_JSON = "bad_json"
#: Every reason code, in the order the checks report them.
REASON_CODES = (BAD_LINE, BAD_ID, MISSING_FIELD, BAD_NUMBER, UNKNOWN_FATE, BAD_JSON)

#: Columns of the events output, in order (``day``, ``queue`` and ``batch`` are the partitions).
EVENT_COLUMNS = (
    "stream_id",
    "id_ms",
    "id_seq",
    "fate",
    "at_ms",
    "at",
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
    "day",
    "queue",
    "batch",
)
#: DDL schema to read the events output back with (partition values stay strings).
EVENTS_SCHEMA = (
    "stream_id string, id_ms bigint, id_seq bigint, fate string, at_ms bigint, at timestamp, "
    "task string, message_id string, attempt bigint, cause string, exc_type string, "
    "reason string, delay double, importance string, first_failure_ms bigint, obituary string, "
    "day string, queue string, batch string"
)
#: DDL schema of the malformed output.
MALFORMED_SCHEMA = "stream_id string, reason_code string, reason string, raw string, batch string"


def _quote(value: Any) -> Any:
    from pyspark.sql import functions as F

    return F.concat(F.lit("'"), F.substring(value, 1, 80), F.lit("'"))


def _parsed_columns() -> dict[str, Any]:
    """Typed values of the raw text columns (null when absent or unparseable)."""
    from pyspark.sql import functions as F

    ms = "try_cast(substring_index(id, '-', 1) AS BIGINT)"
    seq = "try_cast(substring_index(id, '-', -1) AS BIGINT)"
    # canonical ids only: "12-3", not "012-3", "+12-3" or "12-3-4"
    canonical = f"concat({ms}, '-', {seq}) = id AND {ms} >= 0 AND {seq} >= 0"
    return {
        "id_ms": F.expr(f"CASE WHEN {canonical} THEN {ms} END"),
        "id_seq": F.expr(f"CASE WHEN {canonical} THEN {seq} END"),
        "at_ms_n": F.expr("try_cast(at_ms AS BIGINT)"),
        "attempt_n": F.expr("try_cast(attempt AS BIGINT)"),
        "first_failure_ms_n": F.expr("try_cast(first_failure_ms AS BIGINT)"),
        "delay_n": F.expr("try_cast(delay AS DOUBLE)"),
    }


def _checks() -> list[tuple[str, str, Any, Any]]:
    """``(flag column, reason code, condition, reason text)``, in the order they are reported;
    conditions read the raw text and the columns of :func:`_parsed_columns`."""
    from pyspark.sql import functions as F

    def bad_integer(name: str, maximum: int | None) -> Any:
        value = F.col(f"{name}_n")
        bad = value.isNull() | (value < 0)
        if maximum is not None:
            bad = bad | (value >= maximum)
        return F.col(name).isNotNull() & bad

    delay = F.col("delay_n")
    bad_delay = F.col("delay").isNotNull() & (
        delay.isNull() | F.isnan(delay) | (delay < 0) | (delay == float("inf"))
    )
    obituary = F.trim(F.col("obituary"))
    bad_obituary = F.col("obituary").isNotNull() & (
        F.expr("json_object_keys(obituary)").isNull() | ~obituary.endswith("}")
    )
    checks: list[tuple[str, str, Any, Any]] = [
        ("_bad_line", BAD_LINE, F.col("_corrupt").isNotNull(), F.lit("snapshot line is not JSON")),
        (
            "_bad_id",
            BAD_ID,
            F.col("id_ms").isNull() | F.col("id_seq").isNull(),
            F.concat(F.lit("bad stream id "), F.coalesce(_quote(F.col("id")), F.lit("(none)"))),
        ),
    ]
    for name in REQUIRED_FIELDS:
        message = F.lit(f"missing field '{name}'")
        checks.append((f"_missing_{name}", MISSING_FIELD, F.col(name).isNull(), message))
    fate_text = F.concat(F.lit("unknown fate "), _quote(F.col("fate")))
    checks.append(("_bad_fate", UNKNOWN_FATE, ~F.col("fate").isin(*FATES), fate_text))
    for name, bad in (
        ("at_ms", bad_integer("at_ms", MAX_AT_MS)),
        ("attempt", bad_integer("attempt", None)),
        ("first_failure_ms", bad_integer("first_failure_ms", MAX_AT_MS)),
        ("delay", bad_delay),
    ):
        message = F.concat(F.lit(f"bad number in '{name}': "), _quote(F.col(name)))
        checks.append((f"_bad_{name}", BAD_NUMBER, bad, message))
    obituary_text = F.lit("'obituary' is not a JSON object")
    checks.append(("_bad_obituary", BAD_JSON, bad_obituary, obituary_text))
    return checks


def validate(raw: Any) -> Any:
    """Typed columns plus ``reason_code``/``reason_text`` (null when the record is good) for a
    raw frame of ``dlx_source.RAW_COLUMNS``."""
    from pyspark.sql import functions as F

    names = ("id", *HISTORY_FIELDS)
    frame = raw.select(*[F.nullif(F.col(n), F.lit("")).alias(n) for n in names], "_corrupt")
    frame = frame.select("*", *[value.alias(name) for name, value in _parsed_columns().items()])
    checks = _checks()
    # every check once, as a column, so the code and the reason below only read booleans
    flagged = frame.select("*", *[condition.alias(flag) for flag, _, condition, _ in checks])
    code = F.lit(None).cast("string")
    reason = F.lit(None).cast("string")
    for flag, check_code, _, message in reversed(checks):
        code = F.when(F.col(flag), F.lit(check_code)).otherwise(code)
        reason = F.when(F.col(flag), message).otherwise(reason)
    columns = [*names, "_corrupt", *_parsed_columns()]
    return flagged.select(*columns, code.alias("reason_code"), reason.alias("reason_text"))


def counted(validated: Any) -> tuple[Any, Any]:
    """``validated`` as it is, and an Observation of it that holds, once an action ran the frame,
    ``good`` (records without a reason), a count per code of ``REASON_CODES`` and ``last`` (the
    largest usable id, a struct of ``id_ms`` and ``id_seq``; None when there is none). They are
    counted as the rows go by, in the action's own tasks: no job of their own."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    code = F.col("reason_code")
    usable = F.col("id_ms").isNotNull() & F.col("id_seq").isNotNull()
    observation = Observation()
    observed = validated.observe(
        observation,
        F.count_if(code.isNull()).alias("good"),
        *[F.count_if(code == reason).alias(reason) for reason in REASON_CODES],
        F.max(F.when(usable, F.struct("id_ms", "id_seq"))).alias("last"),
    )
    return observed, observation


def after(frame: Any, checkpoint: tuple[int, int] | None) -> Any:
    """Records of a validated frame newer than the checkpoint id (records without a usable id are
    kept: they are malformed and reported)."""
    from pyspark.sql import functions as F

    if checkpoint is None:
        return frame
    ms, seq = checkpoint
    newer = (F.col("id_ms") > F.lit(ms)) | ((F.col("id_ms") == F.lit(ms)) & (F.col("id_seq") > seq))
    return frame.filter(F.col("id_ms").isNull() | F.col("id_seq").isNull() | newer)


def events(validated: Any, batch: str) -> Any:
    """The good records as the events output (``EVENT_COLUMNS``)."""
    from pyspark.sql import functions as F

    good = validated.filter(F.col("reason_code").isNull())
    day = F.date_add(
        F.lit("1970-01-01").cast("date"), F.floor(F.col("at_ms_n") / 86400000).cast("int")
    )
    columns = {
        "stream_id": F.col("id"),
        "id_ms": F.col("id_ms"),
        "id_seq": F.col("id_seq"),
        "fate": F.col("fate"),
        "at_ms": F.col("at_ms_n"),
        "at": F.timestamp_millis(F.col("at_ms_n")),
        **{name: F.coalesce(F.col(name), F.lit("")) for name in TEXT_FIELDS},
        "message_id": F.col("message_id"),
        "attempt": F.col("attempt_n"),
        "delay": F.col("delay_n"),
        "first_failure_ms": F.col("first_failure_ms_n"),
        "obituary": F.col("obituary"),
        "day": day.cast("string"),
        "queue": F.col("queue"),
        "batch": F.lit(batch),
    }
    return good.select(*[columns[name].alias(name) for name in EVENT_COLUMNS])


def malformed(validated: Any, batch: str) -> Any:
    """The malformed records with their reasons and their raw text (``MALFORMED_SCHEMA``)."""
    from pyspark.sql import functions as F

    bad = validated.filter(F.col("reason_code").isNotNull())
    fields = F.to_json(F.struct(F.col("id"), *[F.col(name) for name in HISTORY_FIELDS]))
    return bad.select(
        F.col("id").alias("stream_id"),
        "reason_code",
        F.col("reason_text").alias("reason"),
        F.coalesce(F.col("_corrupt"), fields).alias("raw"),
        F.lit(batch).alias("batch"),
    )
