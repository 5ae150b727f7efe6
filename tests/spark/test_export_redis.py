"""The exporter on a real local SparkSession reading the history stream from the real Redis."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REDIS_URL

from . import checks, generated

dlx_export = pytest.importorskip("celery_dlx_spark.export")

pytestmark = pytest.mark.spark
from celery_dlx_spark import aggregates as dlx_aggregates  # noqa: E402
from celery_dlx_spark import chart as dlx_chart  # noqa: E402
from celery_dlx_spark import progress as dlx_progress  # noqa: E402
from celery_dlx_spark import records as dlx_records  # noqa: E402
from celery_dlx_spark import source as dlx_source  # noqa: E402
from celery_dlx_spark import storage as dlx_storage  # noqa: E402
from celery_dlx_spark import stream as dlx_stream  # noqa: E402


def _options(out: Path, prefix: str, **kwargs: Any) -> Any:
    kwargs.setdefault("progress", False)
    return dlx_export.ExportOptions(out=str(out), redis_url=REDIS_URL, prefix=prefix, **kwargs)


def test_export_from_redis_gives_exact_aggregates(
    spark: Any, redis_client: Any, key_prefix: str, keys: Any, tmp_path: Path
) -> None:
    entries = generated.history()
    generated.write(redis_client, keys.history, entries)
    out = tmp_path / "out"

    result = dlx_export.export(spark, _options(out, key_prefix, ranges=4))

    assert result["status"] == "exported"
    assert result["ranges"] == 4
    assert result["records"] == generated.VALID
    assert result["malformed"] == sum(generated.MALFORMED.values())
    assert result["malformed_by_reason"] == generated.MALFORMED
    assert result["end_id"] == entries[-1][0]
    checks.assert_events(spark, out, checks.valid_ids(entries))
    checks.assert_aggregates(spark, out)
    checks.assert_summary(result["summary"])

    malformed = spark.read.parquet(str(out / "malformed")).collect()
    reasons = {json.loads(row["raw"])["message_id"]: row["reason"] for row in malformed}
    assert reasons == {
        "bad0": "missing field 'at_ms'",
        "bad1": "bad number in 'attempt': 'two'",
        "bad2": "unknown fate 'exploded'",
        "bad3": "'obituary' is not a JSON object",
        "bad4": "bad number in 'delay': 'soon'",
    }

    checkpoint = json.loads((out / "_checkpoint.json").read_text())
    assert checkpoint["last_id"] == entries[-1][0]
    assert checkpoint["aggregated_id"] == entries[-1][0]
    assert (checkpoint["exported"], checkpoint["malformed"], checkpoint["batches"]) == (151, 5, 1)
    mirror = redis_client.hgetall(keys.history + ":export")
    assert mirror[b"last_id"].decode() == entries[-1][0]
    assert redis_client.xlen(keys.history) == len(entries), "no --trim: the stream stays whole"

    hourly = dlx_chart.hourly_failures(checks.read_events(spark, out), days=7)
    first_hour = (generated.DAY1 + 6 * generated.H) // generated.H
    assert hourly["hours"] == list(range(first_hour, first_hour + 22)), "day 1 06:00 to day 2 03:00"
    by_hour = {
        label: {h: n for h, n in zip(hourly["hours"], counts, strict=True) if n}
        for label, counts in hourly["series"].items()
    }
    assert by_hour == {
        "c-timeout Timeout": {first_hour + 2: 60, first_hour + 21: 4},
        "c-db OperationalError": {first_hour + 6: 15},
        "c-smtp SMTPServerDisconnected": {first_hour + 3: 5},
        "(unknown cause)": {first_hour: 3},
        "c-late TimeoutError": {first_hour + 17: 1},
    }
    # the run's chart takes its window from the message facts: the same hours as the events give
    events = checks.read_events(spark, out)
    facts = dlx_aggregates.message_facts(events)
    bounds = dlx_aggregates.failure_bounds(facts)
    assert dlx_chart.hourly_failures(events, days=7, bounds=bounds) == hourly
    # every aggregate comes from the facts, and the facts shuffle the events once, by message
    plan = facts._jdf.queryExecution().executedPlan().toString()
    assert plan.count("Exchange ") == 1 and "Exchange hashpartitioning(message_id" in plan
    top2 = dlx_chart.hourly_failures(checks.read_events(spark, out), days=7, top=2)
    assert list(top2["series"]) == ["c-timeout Timeout", "c-db OperationalError", "other causes"]
    assert sum(top2["series"]["other causes"]) == 5 + 3 + 1
    png = (out / "failures_by_cause.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10000
    text = dlx_export.format_result(result)
    assert "c-timeout" in text and "72.7%" in text and "malformed bad_number: 2" in text

    again = dlx_export.export(spark, _options(out, key_prefix, ranges=4))
    assert again["status"] == "up-to-date" and again["records"] == 0
    assert "summary" not in again, "nothing new: the aggregates are not recomputed"
    checks.assert_events(spark, out, checks.valid_ids(entries))


def test_interrupted_export_resumes_without_duplicates_or_gaps(
    spark: Any, redis_client: Any, key_prefix: str, keys: Any, tmp_path: Path
) -> None:
    entries = generated.history()
    first, second, third = entries[:80], entries[80:120], entries[120:]
    out = tmp_path / "out"
    generated.write(redis_client, keys.history, first)
    done = dlx_export.export(spark, _options(out, key_prefix, ranges=3, aggregates=False))
    assert done["records"] == len(checks.valid_ids(first))

    # an export killed after its Parquet write, before its checkpoint
    generated.write(redis_client, keys.history, second)
    storage = dlx_storage.open_storage(spark, str(out))
    counter = spark.sparkContext.accumulator(0)
    with dlx_progress.Progress(spark, enabled=False) as progress:
        client = dlx_source.connect(REDIS_URL)
        try:
            partial = dlx_export.write_batch(
                spark,
                _options(out, key_prefix, ranges=2),
                storage,
                client,
                keys.history,
                first[-1][0],
                counter,
                progress,
            )
        finally:
            client.close()
    assert partial is not None and partial.end_id == second[-1][0]
    checks.assert_events(spark, out, checks.valid_ids(first + second))
    # killed mid-write, it would also leave tasks committed into the job's _temporary directory
    # (files the next job's commit would merge into the output if they were left there)
    written = next((out / "events").glob(f"day=*/queue=orders/batch={partial.name}"))
    task = out / "events" / "_temporary" / "0" / "task_202403040000_0001_m_000000"
    shutil.copytree(written, task / written.relative_to(out / "events"))
    assert dlx_storage.read_checkpoint(storage).last_id == first[-1][0]

    generated.write(redis_client, keys.history, third)
    resumed = dlx_export.export(spark, _options(out, key_prefix, ranges=5, trim=True))

    assert resumed["batch"] == partial.name, "the rerun rewrites the interrupted batch"
    assert resumed["records"] == len(checks.valid_ids(second + third))
    checks.assert_events(spark, out, checks.valid_ids(entries))
    checks.assert_aggregates(spark, out)
    checkpoint = dlx_storage.read_checkpoint(storage)
    assert (checkpoint.exported, checkpoint.malformed, checkpoint.batches) == (151, 5, 2)
    assert resumed["trimmed"] == len(entries)
    assert redis_client.xlen(keys.history) == 0

    late = (f"{generated.DAY2 + 5 * generated.H}-0", dict(entries[-1][1], message_id="z1"))
    generated.write(redis_client, keys.history, [late])
    after_trim = dlx_export.export(spark, _options(out, key_prefix, aggregates=False))
    assert after_trim["records"] == 1 and after_trim["start_after"] == entries[-1][0]
    checks.assert_events(spark, out, checks.valid_ids(entries) | {late[0]})


def test_a_second_export_of_the_same_stream_is_refused(
    spark: Any, redis_client: Any, key_prefix: str, keys: Any, tmp_path: Path
) -> None:
    generated.write(redis_client, keys.history, generated.history()[:5])
    with (
        dlx_stream.ExportLock(redis_client, keys.history),
        pytest.raises(dlx_stream.LockedError, match="another export"),
    ):
        dlx_export.export(spark, _options(tmp_path / "out", key_prefix))
    assert not (tmp_path / "out" / "_checkpoint.json").exists()


def test_an_output_directory_serves_one_stream(
    spark: Any, redis_client: Any, key_prefix: str, keys: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    storage = dlx_storage.LocalStorage(str(out))
    dlx_storage.write_checkpoint(storage, dlx_storage.Checkpoint(stream="{other}:history"))
    with pytest.raises(dlx_export.ExportError, match="--prefix"):
        dlx_export.export(spark, _options(out, key_prefix))


def test_commit_refuses_a_checkpoint_moved_by_another_run(tmp_path: Path) -> None:
    storage = dlx_storage.LocalStorage(str(tmp_path))
    dlx_storage.write_checkpoint(storage, dlx_storage.Checkpoint(stream="s", last_id="5-0"))
    batch = dlx_export.Batch("after-4-0", "4-0", "9-0", 3, 0, {}, 1)
    with pytest.raises(dlx_export.ExportError, match="moved during this export"):
        dlx_export.commit(storage, dlx_storage.Checkpoint(stream="s", last_id="4-0"), batch)
    assert dlx_storage.read_checkpoint(storage).last_id == "5-0"


def _write_batch(spark: Any, out: Path, prefix: str, key: str, counter: Any) -> Any:
    storage = dlx_storage.open_storage(spark, str(out))
    client = dlx_source.connect(REDIS_URL)
    try:
        with dlx_progress.Progress(spark, enabled=False) as progress:
            return dlx_export.write_batch(
                spark,
                _options(out, prefix, ranges=3),
                storage,
                client,
                key,
                None,
                counter,
                progress,
            )
    finally:
        client.close()


def test_a_batch_is_read_once_and_counted_as_it_is_written(
    spark: Any, redis_client: Any, key_prefix: str, keys: Any, tmp_path: Path
) -> None:
    good = [entry for entry in generated.history() if entry[0] in checks.valid_ids([entry])]
    generated.write(redis_client, keys.history, good)
    counter = spark.sparkContext.accumulator(0)

    batch = _write_batch(spark, tmp_path / "out", key_prefix, keys.history, counter)

    assert counter.value == len(good), "no malformed record: the stream is read once"
    assert (batch.records, batch.malformed, batch.by_reason) == (len(good), 0, {})
    checks.assert_events(spark, tmp_path / "out", checks.valid_ids(good))
    malformed = spark.read.schema(dlx_records.MALFORMED_SCHEMA).parquet(
        str(tmp_path / "out" / "malformed")
    )
    assert malformed.count() == 0
    assert not (tmp_path / "out" / dlx_export.STAGING).exists()


def test_malformed_records_are_read_again_and_must_count_the_same(
    spark: Any, redis_client: Any, key_prefix: str, keys: Any, tmp_path: Path
) -> None:
    entries = generated.history()
    generated.write(redis_client, keys.history, entries)
    counter = spark.sparkContext.accumulator(0)

    batch = _write_batch(spark, tmp_path / "out", key_prefix, keys.history, counter)

    assert counter.value == 2 * len(entries), "malformed records: read once more for them"
    assert (batch.records, batch.by_reason) == (generated.VALID, generated.MALFORMED)
    assert spark.read.parquet(str(tmp_path / "out" / "malformed")).count() == batch.malformed
    # what a pass counts on the way equals a count of the validated records by reason
    frame = dlx_source.redis_frame(spark, REDIS_URL, keys.history, [("-", "+")], 50, counter)
    validated = dlx_records.validate(frame)
    observed, counts = dlx_records.counted(validated)
    observed.write.format("noop").mode("overwrite").save()
    stats = counts.get
    grouped = validated.groupBy("reason_code").count().collect()
    assert {row["reason_code"]: row["count"] for row in grouped} == {
        None: stats["good"],
        **{code: stats[code] for code in dlx_records.REASON_CODES if stats[code]},
    }
    assert (stats["good"], stats["last"]) == (
        batch.records,
        tuple(map(int, entries[-1][0].split("-"))),
    )

    # an entry deleted between the two reads: the second read counts otherwise, so it fails
    redis_client.xdel(keys.history, entries[0][0])
    again = dlx_storage.LocalStorage(str(tmp_path / "again"))
    with pytest.raises(dlx_export.ExportError, match="changed between the export's two reads"):
        dlx_export._write_malformed(spark, again, validated, "after-0-0", stats)
