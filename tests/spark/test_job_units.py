"""Pure parts of the Spark job (no SparkSession): ranges, page encoding, names, options."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from celery_dlx import fates
from celery_dlx.message import names
from celery_dlx.store import history

dlx_source = pytest.importorskip("celery_dlx_spark.source")

pytestmark = pytest.mark.spark
from celery_dlx_spark import aggregates as dlx_aggregates  # noqa: E402
from celery_dlx_spark import export as dlx_export  # noqa: E402
from celery_dlx_spark import records as dlx_records  # noqa: E402
from celery_dlx_spark import storage as dlx_storage  # noqa: E402
from celery_dlx_spark import stream as dlx_stream  # noqa: E402


def test_the_job_agrees_with_the_package_on_names_fields_and_fates() -> None:
    assert (*history.HISTORY_FIELDS, "obituary") == dlx_source.HISTORY_FIELDS
    assert dlx_records.FATES == fates.HISTORY_KINDS
    assert dlx_source.history_key("shop") == names.Keys("shop").history
    assert dlx_records.FAILURE_FATES == (fates.REQUEUED, fates.PARKED, fates.BURIED)


def test_the_job_builds_the_export_keys_the_package_names() -> None:
    keys = names.Keys("shop")
    assert dlx_stream.mirror_key(keys.history) == keys.history_export
    assert dlx_stream.ExportLock(None, keys.history).key == keys.history_export_lock


def _covered(ranges: list[tuple[str, str]]) -> list[tuple[int, int]]:
    """(first ms, last ms) of each range, checking ranges are ordered and disjoint."""
    spans = []
    for start, end in ranges:
        first = dlx_source.parse_id(start.lstrip("("))[0]
        spans.append((first, dlx_source.parse_id(end)[0]))
    for (_, last), (first, _) in itertools.pairwise(spans):
        assert first == last + 1
    return spans


def test_ranges_split_the_ids_after_the_checkpoint_without_gaps_or_overlaps() -> None:
    ranges = dlx_source.split_ranges("1000-5", "900-0", "1999-3", 4)
    assert ranges[0][0] == "(1000-5" and ranges[-1][1] == "1999-3"
    assert _covered(ranges) == [(1000, 1249), (1250, 1499), (1500, 1749), (1750, 1999)]
    assert ranges[1] == ("1250-0", f"1499-{dlx_source.MAX_SEQ}")


def test_ranges_from_the_start_and_on_tiny_spans() -> None:
    assert dlx_source.split_ranges(None, "7-0", "7-9", 8) == [("7-0", "7-9")]
    assert dlx_source.split_ranges(None, "1-0", "3-0", 10) == [
        ("1-0", f"1-{dlx_source.MAX_SEQ}"),
        ("2-0", f"2-{dlx_source.MAX_SEQ}"),
        ("3-0", "3-0"),
    ]
    assert dlx_source.split_ranges("5-1", "1-0", "5-1", 4) == []
    assert dlx_source.split_ranges("9-0", "1-0", "5-1", 4) == []


def test_page_blobs_keep_columns_even_with_separators_in_values() -> None:
    rows = [
        (b"1-0", [b"fate", b"parked", b"queue", b"q", b"delay", b"1.5"]),
        (b"1-1", [b"task", b"\xff", b"fate", b"buried", b"reason", b"a\x1eb\x1fc"]),
        (b"1-2", [b"queue", b"x", b"queue", b"y", b"extra", b"kept out"]),
    ]
    blob = dlx_source.encode_page(rows)
    records = blob.split(dlx_source.RECORD_SEP)
    assert len(records) == 3
    first, second, third = (record.split(dlx_source.UNIT_SEP) for record in records)
    assert len(first) == len(second) == len(third) == len(dlx_source.RAW_COLUMNS) - 1
    columns = dlx_source.RAW_COLUMNS
    assert first[columns.index("delay")] == "1.5" and first[columns.index("task")] == ""
    assert second[columns.index("reason")] == "a\ufffdb\ufffdc"
    assert second[columns.index("task")] == "\ufffd"
    assert third[columns.index("queue")] == "y", "a repeated field: the last value, as in a dict"
    assert "kept out" not in records[2]


def test_page_blobs_are_the_same_from_dict_replies() -> None:
    # a RedisCluster applies its nodes' XRANGE callback, so the fields come as a dict there
    # (they were sliced like a list: "TypeError: unhashable type: 'slice'")
    rows = [
        (b"1-0", [b"fate", b"parked", b"queue", b"q", b"delay", b"1.5"]),
        (b"1-1", [b"task", b"\xff", b"fate", b"buried", b"reason", b"a\x1eb\x1fc"]),
    ]
    as_dicts = [
        (entry_id, dict(zip(flat[0::2], flat[1::2], strict=True))) for entry_id, flat in rows
    ]
    assert dlx_source.encode_page(as_dicts) == dlx_source.encode_page(list(rows))


@pytest.mark.parametrize(
    ("requested", "configured", "submitted", "chosen"),
    [
        (None, "spark://m:7077", True, "spark://m:7077"),  # spark-submit --master
        (None, "yarn", True, "yarn"),
        (None, "local[*]", True, "local[*]"),  # spark-submit's own default
        ("yarn", "yarn", True, "yarn"),
        ("local[2]", "local[*]", False, "local[2]"),  # python -m ... --master
        (None, "k8s://https://k:443", False, "k8s://https://k:443"),  # spark-defaults.conf
        (None, None, False, "local[*]"),  # nothing set one
    ],
)
def test_the_master_is_never_replaced(
    requested: str | None, configured: str | None, submitted: bool, chosen: str
) -> None:
    assert dlx_export.choose_master(requested, configured, submitted) == chosen


def test_a_job_master_differing_from_spark_submits_is_refused() -> None:
    with pytest.raises(dlx_export.ExportError, match="spark-submit's --master"):
        dlx_export.choose_master("local[2]", "spark://m:7077", submitted=True)


def test_ids_and_successors() -> None:
    assert dlx_source.parse_id(b"17-3") == (17, 3)
    assert dlx_stream.successor("17-3") == "17-4"
    assert dlx_stream.successor(f"17-{2**64 - 1}") == "18-0"
    with pytest.raises(ValueError, match="not a stream id"):
        dlx_source.parse_id("17")


def test_batches_are_named_after_their_checkpoint() -> None:
    assert dlx_export.batch_name(None) == "after-0-0"
    assert dlx_export.batch_name("17-3") == "after-17-3"


@pytest.mark.parametrize(
    ("changes", "option"),
    [
        ({"redis_url": None}, "--redis-url"),
        ({"snapshot": "x.jsonl", "trim": True}, "--trim"),
        ({"prefix": "a{b}"}, "--prefix"),
        ({"ranges": 0}, "--ranges"),
        ({"page_size": 0}, "--page-size"),
        ({"chart_days": 0}, "--chart-days"),
    ],
)
def test_bad_options_name_the_option(changes: dict[str, object], option: str) -> None:
    options = dlx_export.ExportOptions(out="/tmp/x", redis_url="redis://127.0.0.1:6379/0")
    for name, value in changes.items():
        setattr(options, name, value)
    with pytest.raises(dlx_export.ExportError, match=option):
        options.check()


def test_local_checkpoint_is_replaced_atomically_and_batches_deleted(tmp_path: Path) -> None:
    storage = dlx_storage.LocalStorage(str(tmp_path))
    assert dlx_storage.read_checkpoint(storage) is None
    dlx_storage.write_checkpoint(storage, dlx_storage.Checkpoint(stream="s", last_id="1-0"))
    dlx_storage.write_checkpoint(storage, dlx_storage.Checkpoint(stream="s", last_id="2-0"))
    assert dlx_storage.read_checkpoint(storage).last_id == "2-0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_checkpoint.json"]
    for day in ("day=1", "day=2"):
        (tmp_path / "events" / day / "queue=q" / "batch=after-1-0").mkdir(parents=True)
    (tmp_path / "events" / "day=1" / "queue=q" / "batch=after-0-0").mkdir()
    assert storage.delete_glob("events/day=*/queue=*/batch=after-1-0") == 2
    assert [p.name for p in (tmp_path / "events").glob("*/*/*")] == ["batch=after-0-0"]


def test_an_unreadable_checkpoint_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    (tmp_path / "_checkpoint.json").write_text('{"stream": "s", "last_id": ')
    with pytest.raises(dlx_storage.CheckpointError, match="not a readable checkpoint"):
        dlx_storage.read_checkpoint(dlx_storage.LocalStorage(str(tmp_path)))


def test_summary_table_lines_up() -> None:
    rows = [
        {
            "queue": "orders",
            "task": "t",
            "cause": "c",
            "exc_type": "E",
            "failures": 12,
            "requeues": 10,
            "parks": 1,
            "burials": 1,
            "replays": 0,
            "retry_success_rate": 0.5,
            "ttr_p50_s": 1.25,
            "ttr_p95_s": None,
        },
    ]
    table = dlx_aggregates.format_table({"failures": 12, "retry_success_rate": 0.5}, rows)
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["queue", "task", "cause", "exception"]
    assert "50.0%" in lines[2] and "1.2s" in lines[2] and lines[2].rstrip().endswith("-")
    assert lines[3].startswith("ALL")
