"""Validation of raw history records, in the JVM: typed events and malformed records with reasons.

A record is malformed when its id is not a stream id, a required field is missing or empty, a
number does not parse or is out of range, its fate is unknown, or its obituary is not a JSON
object. Malformed records are kept whole (``raw``) with the first reason found; they are counted
and never stop an export.
"""

from __future__ import annotations

from typing import Any

from dlx_source import HISTORY_FIELDS

#: Fates the history records (``celery_dlx.fates.FATE_CHANGES``).
FATES = ("requeued", "parked", "drained", "buried", "replayed", "purged", "recovered", "archived")
#: Fates that follow a failed attempt: every failure leads to exactly one of them.
FAILURE_FATES = ("requeued", "parked", "buried")
#: Fields a record cannot do without.
REQUIRED_FIELDS = ("fate", "at_ms", "queue", "message_id", "attempt")
#: Text fields that default to "" (foreign messages have no task, unknown causes are empty).
TEXT_FIELDS = ("task", "cause", "exc_type", "reason", "importance")
#: First millisecond of year 10000: later timestamps are bad numbers, not dates.
MAX_AT_MS = 253402300800000
_INTEGER = r"^[0-9]{1,19}$"
_DECIMAL = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)$"
_STREAM_ID = "^([0-9]{1,19})-([0-9]{1,19})$"

#: Reason codes of malformed records.
BAD_LINE = "bad_json_line"
BAD_ID = "bad_id"
MISSING_FIELD = "missing_field"
BAD_NUMBER = "bad_number"
UNKNOWN_FATE = "unknown_fate"
BAD_JSON = "bad_json"

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


def _integer(name: str, maximum: int | None = None) -> tuple[Any, Any]:
    """(parsed column or null, condition that the present value is bad)."""
    from pyspark.sql import functions as F

    text = F.col(name)
    value = F.when(text.rlike(_INTEGER), F.expr(f"try_cast(`{name}` AS BIGINT)"))
    bad = text.isNotNull() & value.isNull()
    if maximum is not None:
        bad = bad | (value >= F.lit(maximum))
    return value, bad


def validate(raw: Any) -> Any:
    """Typed columns plus ``reason_code``/``reason`` (null when the record is good) for a raw
    frame of ``dlx_source.RAW_COLUMNS``."""
    from pyspark.sql import functions as F

    blank = {name: F.nullif(F.col(name), F.lit("")) for name in (*HISTORY_FIELDS, "id")}
    frame = raw.select(*[blank[name].alias(name) for name in blank], "_corrupt")
    for part, name in ((1, "id_ms"), (2, "id_seq")):
        digits = f"regexp_extract(id, '{_STREAM_ID}', {part})"
        frame = frame.withColumn(name, F.expr(f"try_cast(nullif({digits}, '') AS BIGINT)"))

    at_ms, bad_at = _integer("at_ms", MAX_AT_MS)
    attempt, bad_attempt = _integer("attempt")
    first_failure, bad_first = _integer("first_failure_ms", MAX_AT_MS)
    delay = F.when(F.col("delay").rlike(_DECIMAL), F.expr("try_cast(delay AS DOUBLE)"))
    bad_delay = F.col("delay").isNotNull() & delay.isNull()
    obituary = F.trim(F.col("obituary"))
    bad_obituary = F.col("obituary").isNotNull() & (
        F.expr("json_object_keys(obituary)").isNull() | ~obituary.endswith("}")
    )

    checks: list[tuple[Any, str, Any]] = [
        (F.col("_corrupt").isNotNull(), BAD_LINE, F.lit("snapshot line is not a JSON object")),
        (
            F.col("id_ms").isNull() | F.col("id_seq").isNull(),
            BAD_ID,
            F.concat(F.lit("bad stream id "), F.coalesce(_quote(F.col("id")), F.lit("(none)"))),
        ),
    ]
    for name in REQUIRED_FIELDS:
        checks.append((F.col(name).isNull(), MISSING_FIELD, F.lit(f"missing field '{name}'")))
    checks.append(
        (
            ~F.col("fate").isin(*FATES),
            UNKNOWN_FATE,
            F.concat(F.lit("unknown fate "), _quote(F.col("fate"))),
        )
    )
    for name, bad in (
        ("at_ms", bad_at),
        ("attempt", bad_attempt),
        ("first_failure_ms", bad_first),
        ("delay", bad_delay),
    ):
        message = F.concat(F.lit(f"bad number in '{name}': "), _quote(F.col(name)))
        checks.append((bad, BAD_NUMBER, message))
    checks.append((bad_obituary, BAD_JSON, F.lit("'obituary' is not a JSON object")))

    code = F.lit(None).cast("string")
    reason = F.lit(None).cast("string")
    for condition, check_code, message in reversed(checks):
        code = F.when(condition, F.lit(check_code)).otherwise(code)
        reason = F.when(condition, message).otherwise(reason)

    return frame.select(
        "*",
        at_ms.alias("at_ms_n"),
        attempt.alias("attempt_n"),
        first_failure.alias("first_failure_ms_n"),
        delay.alias("delay_n"),
        code.alias("reason_code"),
        reason.alias("reason_text"),
    )


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
