"""The exporter reading a JSON-lines snapshot (the offline path), on a real local SparkSession."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from celery_dlx.store.history import History
from celery_dlx_spark.launch import dump_snapshot

from . import checks, generated

dlx_export = pytest.importorskip("celery_dlx_spark.export")

pytestmark = pytest.mark.spark

#: Lines a hand-edited or truncated snapshot may hold: not JSON, a bad id, an empty line.
BAD_LINES = ['{"id": "1709510400000-0", "fate": "requeued", "at_ms": "17', '{"id":"abc"}', ""]


def test_snapshot_export_gives_exact_aggregates_and_resumes(
    spark: Any, redis_client: Any, key_prefix: str, keys: Any, tmp_path: Path
) -> None:
    entries = generated.history()
    generated.write(redis_client, keys.history, entries)
    snapshot = tmp_path / "history.jsonl"
    assert dump_snapshot(History(redis_client, keys), snapshot, page=50) == len(entries)
    with snapshot.open("a", encoding="utf-8") as handle:
        handle.write("\n".join(BAD_LINES) + "\n")
    out = tmp_path / "out"
    options = dlx_export.ExportOptions(
        out=str(out), snapshot=str(snapshot), prefix=key_prefix, progress=False
    )

    result = dlx_export.export(spark, options)

    assert result["records"] == generated.VALID
    assert result["malformed_by_reason"] == {
        **generated.MALFORMED,
        "bad_json_line": 1,
        "bad_id": 1,
    }
    assert result["end_id"] == entries[-1][0]
    checks.assert_events(spark, out, checks.valid_ids(entries))
    checks.assert_aggregates(spark, out)
    checks.assert_summary(result["summary"])
    assert redis_client.xlen(keys.history) == len(entries), "a snapshot export never trims"

    # a later snapshot holding the old entries and one new: only the new one is exported
    new = (f"{generated.DAY2 + 7 * generated.H}-0", dict(entries[0][1], message_id="n1"))
    later = tmp_path / "later.jsonl"
    lines = snapshot.read_text(encoding="utf-8")
    later.write_text(lines + json.dumps({"id": new[0], **new[1]}) + "\n", encoding="utf-8")
    options.snapshot = str(later)
    options.aggregates = False

    second = dlx_export.export(spark, options)

    assert second["records"] == 1 and second["start_after"] == entries[-1][0]
    # lines without a usable id cannot be placed after the checkpoint: reported again
    assert second["malformed_by_reason"] == {"bad_json_line": 1, "bad_id": 1}
    checks.assert_events(spark, out, checks.valid_ids(entries) | {new[0]})


def test_snapshot_of_nothing_new_is_up_to_date(spark: Any, tmp_path: Path) -> None:
    snapshot = tmp_path / "empty.jsonl"
    snapshot.write_text("", encoding="utf-8")
    options = dlx_export.ExportOptions(
        out=str(tmp_path / "out"), snapshot=str(snapshot), progress=False
    )
    result = dlx_export.export(spark, options)
    assert result["status"] == "up-to-date"
    assert not (tmp_path / "out" / "events").exists()
