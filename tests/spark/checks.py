"""Assertions on an export's output directory shared by the Spark tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from . import expected, generated


def valid_ids(entries: list[tuple[str, dict[str, str]]]) -> set[str]:
    """Stream ids of the generated entries that are not malformed (their ids start with bad)."""
    return {eid for eid, fields in entries if not fields["message_id"].startswith("bad")}


def read_events(spark: Any, out: Path) -> Any:
    from celery_dlx_spark import records as dlx_records

    path = str(out / "events")
    return spark.read.schema(dlx_records.EVENTS_SCHEMA).option("basePath", path).parquet(path)


def assert_events(spark: Any, out: Path, ids: set[str]) -> None:
    """Exactly these stream ids were exported, once each, in the expected partitions."""
    rows = read_events(spark, out).select("stream_id", "day", "queue").collect()
    exported = [row["stream_id"] for row in rows]
    assert len(exported) == len(set(exported)), "duplicated stream ids in events"
    assert set(exported) == ids
    if ids == valid_ids(generated.history()):
        partitions: dict[tuple[str, str], int] = {}
        for row in rows:
            key = (row["day"], row["queue"])
            partitions[key] = partitions.get(key, 0) + 1
        assert partitions == expected.PARTITIONS


def _same(actual: tuple[Any, ...], wanted: tuple[Any, ...]) -> None:
    assert len(actual) == len(wanted)
    for got, want in zip(actual, wanted, strict=True):
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-9), (actual, wanted)
        else:
            assert got == want, (actual, wanted)


def assert_aggregates(spark: Any, out: Path) -> None:
    """The aggregates and top causes equal the hand-computed values."""
    rows = spark.read.parquet(str(out / "aggregates")).collect()
    daily = {
        (str(row["day"]), row["queue"], row["task"], row["cause"]): tuple(
            row[name] for name in expected.COLUMNS
        )
        for row in rows
    }
    assert set(daily) == set(expected.DAILY)
    for key, values in expected.DAILY.items():
        _same(daily[key], values)
    top = spark.read.parquet(str(out / "top_causes"))
    charge = top.filter(
        (top.day.cast("string") == expected.D1)
        & (top.queue == "orders")
        & (top.task == "shop.charge")
    ).orderBy("rank")
    got = [(r["cause"], r["rank"], r["share"]) for r in charge.collect()]
    assert [(c, r) for c, r, _ in got] == [(c, r) for c, r, _ in expected.TOP_CAUSES_D1_CHARGE]
    for (_, _, share), (_, _, want) in zip(got, expected.TOP_CAUSES_D1_CHARGE, strict=True):
        assert share == pytest.approx(want)


def assert_summary(summary: dict[str, Any]) -> None:
    """The run's summary (totals and rows) equals the hand-computed one."""
    totals = summary["totals"]
    assert totals["failures"] == expected.TOTAL_FAILURES
    assert totals["failed_messages"] == expected.TOTAL_FAILED
    assert totals["recovered_messages"] == expected.TOTAL_RECOVERED
    rows = [
        (
            row["queue"],
            row["task"],
            row["cause"],
            row["failures"],
            row["failed_messages"],
            row["recovered_messages"],
            row["ttr_p50_s"],
            row["ttr_p95_s"],
        )
        for row in summary["rows"]
    ]
    assert len(rows) == len(expected.SUMMARY)
    for got, want in zip(rows, expected.SUMMARY, strict=True):
        _same(got, want)
