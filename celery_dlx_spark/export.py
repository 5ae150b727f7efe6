"""Export celery_dlx's failure history to Parquet, incrementally, with aggregates and a chart.

Run it with ``spark-submit`` (its ``--master``: ``spark://``, ``yarn``, ``k8s://``, ``local[N]``)
or plain ``python`` (``--master``, else the configured master, else ``local[*]``)::

    python -m celery_dlx_spark --redis-url redis://127.0.0.1:6379/0 --prefix dlx --out /data/dlx-history

or ``celery -A proj dlx export --print-command`` for the spark-submit command (the package zipped for
``--py-files`` and a two-line entry script)::

    spark-submit --master 'local[*]' --py-files celery_dlx_spark.zip dlx_export.py \\
        --redis-url redis://127.0.0.1:6379/0 --prefix dlx --out /data/dlx-history

or through ``celery -A proj dlx export``, which builds that command (``celery_dlx_spark.launch``).

One run exports one *batch*: the stream entries after the checkpoint up to the last entry when the
run started. The executors read the stream in id ranges (the driver never reads an entry) and
validate the records, and the good ones are appended to ``OUT/events`` (partitioned by ``day``,
``queue`` and ``batch``) in the same pass, which also counts the batch; malformed ones go to
``OUT/malformed`` with their reason (a batch holding any is read once more for them, and must
count the same). Only then is
``OUT/_checkpoint.json`` replaced (atomically); a run killed before that leaves the checkpoint
where it was, and its rerun first deletes the batch's partial output (the batch is named after
the checkpoint it starts from), so nothing is duplicated or skipped. With ``--trim`` the stream is
trimmed up to the checkpoint, and only after the checkpoint is written. The aggregates
(``OUT/aggregates``, ``OUT/top_causes``), the summary table and ``OUT/failures_by_cause.png`` are
then recomputed from the whole exported history.

The executors import only ``celery_dlx_spark`` (shipped as a zip with ``--py-files`` or
``addPyFile``) and need only redis-py: never Celery or ``celery_dlx``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from typing import Any

import celery_dlx_spark
from celery_dlx_spark import aggregates as dlx_aggregates
from celery_dlx_spark import chart as dlx_chart
from celery_dlx_spark import records as dlx_records
from celery_dlx_spark import source as dlx_source
from celery_dlx_spark import storage as dlx_storage
from celery_dlx_spark import stream as dlx_stream
from celery_dlx_spark.compat import join_gateway
from celery_dlx_spark.progress import Progress

#: Entries per executor range the default range count aims at.
ENTRIES_PER_RANGE = 20000
#: Name of the result of the last run in the output directory.
LAST_RUN = "_last_export.json"
#: Where versions before 2026-11-27 staged each batch (deleted when found: a killed run's).
STAGING = "_staging"
#: Name of the chart in the output directory.
CHART = "failures_by_cause.png"
#: Master of a run that nothing else gave one (plain ``python -m celery_dlx_spark``).
DEFAULT_MASTER = "local[*]"


class ExportError(RuntimeError):
    """The export cannot run as asked; the message names the option to fix."""


@dataclass
class ExportOptions:
    """What to export and how.

    Attributes:
        out: output directory (local path or any Hadoop URI: hdfs://, s3a://...).
        redis_url: Redis holding the history stream (required unless ``snapshot`` is given).
        prefix: celery_dlx key prefix (``dlx_key_prefix``); the stream is ``{prefix}:history``.
        snapshot: a JSON-lines snapshot (path or glob) to read instead of Redis.
        ranges: id ranges the stream is split into (default: enough for the cores).
        page_size: entries per XRANGE call.
        trim: trim the stream up to the checkpoint after a committed export.
        mirror: copy the checkpoint into Redis (``{prefix}:history:export``).
        aggregates: recompute aggregates, summary and chart.
        top_causes: causes kept per day, queue and task in ``top_causes``.
        summary_rows: rows of the summary table.
        chart_days: days of history (before the last failure) drawn in the chart.
        progress: print progress on stderr.
    """

    out: str
    redis_url: str | None = None
    prefix: str = "dlx"
    snapshot: str | None = None
    ranges: int | None = None
    page_size: int = 5000
    trim: bool = False
    mirror: bool = True
    aggregates: bool = True
    top_causes: int = 5
    summary_rows: int = 20
    chart_days: float = 7.0
    progress: bool = True

    def check(self) -> None:
        """Raises ExportError naming the option that is wrong."""
        if not self.out:
            raise ExportError("--out is required: the output directory")
        if not self.prefix or any(c in self.prefix for c in "{} "):
            raise ExportError(
                f"--prefix must be non-empty without braces or spaces: {self.prefix!r}"
            )
        if self.snapshot is None and not self.redis_url:
            raise ExportError(
                "give --redis-url (read the stream) or --snapshot (a JSON-lines file)"
            )
        if self.snapshot is not None and self.trim:
            raise ExportError("--trim trims the Redis stream; it cannot go with --snapshot")
        if self.ranges is not None and self.ranges < 1:
            raise ExportError(f"--ranges must be >= 1, got {self.ranges}")
        if self.page_size < 1:
            raise ExportError(f"--page-size must be >= 1, got {self.page_size}")
        if self.top_causes < 1 or self.summary_rows < 1 or self.chart_days <= 0:
            raise ExportError("--top-causes, --summary-rows and --chart-days must be positive")


def batch_name(after: str | None) -> str:
    """A batch is named after the checkpoint it starts from, so a rerun rewrites the same batch."""
    return f"after-{after or '0-0'}"


def ship_modules(spark: Any) -> None:
    """Make ``celery_dlx_spark`` importable on the executors (once per SparkContext), unless
    spark-submit already shipped it with ``--py-files``."""
    context = spark.sparkContext
    if getattr(context, "_dlx_shipped", False):
        return
    if celery_dlx_spark.ZIP_NAME not in spark.conf.get("spark.submit.pyFiles", ""):
        scratch = tempfile.mkdtemp(prefix="celery-dlx-spark-")
        context.addPyFile(str(celery_dlx_spark.build_zip(scratch)))
    context._dlx_shipped = True


def _default_ranges(spark: Any, length: int) -> int:
    cores = max(1, int(spark.sparkContext.defaultParallelism))
    return max(1, min(4 * cores, math.ceil(length / ENTRIES_PER_RANGE)))


@dataclass
class Batch:
    """One batch written by :func:`write_batch`."""

    name: str
    after: str | None
    end_id: str
    records: int
    malformed: int
    by_reason: dict[str, int]
    ranges: int | None


def _plan_redis(
    spark: Any, options: ExportOptions, client: Any, key: str, after: str | None, counter: Any
) -> tuple[Any, str, int] | None:
    """(validated frame, end id, range count) of the stream entries after the checkpoint."""
    bounds = dlx_stream.stream_bounds(client, key)
    if bounds is None:
        return None
    first, last, length = bounds
    count = options.ranges or _default_ranges(spark, length)
    ranges = dlx_source.split_ranges(after, first, last, count)
    if not ranges:
        return None
    assert options.redis_url is not None
    raw = dlx_source.redis_frame(spark, options.redis_url, key, ranges, options.page_size, counter)
    return dlx_records.validate(raw), last, len(ranges)


def write_batch(
    spark: Any,
    options: ExportOptions,
    storage: dlx_storage.Storage,
    client: Any,
    key: str,
    after: str | None,
    counter: Any,
    progress: Progress,
) -> Batch | None:
    """Step one of an export: write the batch of records after ``after`` (the checkpoint) to
    ``OUT/events`` and ``OUT/malformed``, first deleting what a killed run left of it. The
    checkpoint is not moved (that is :func:`commit`); returns None when nothing is newer.

    Raises:
        ExportError: the batch's records changed between its two reads (see
            :func:`_write_malformed`); nothing was committed.
    """
    progress.set_phase("reading the history")
    range_count: int | None = None
    end_id: str | None = None
    if options.snapshot is None:
        planned = _plan_redis(spark, options, client, key, after, counter)
        if planned is None:
            return None
        validated, end_id, range_count = planned
    else:
        checkpoint_id = dlx_source.parse_id(after) if after else None
        raw = dlx_source.snapshot_frame(spark, options.snapshot)
        validated = dlx_records.after(dlx_records.validate(raw), checkpoint_id)
    batch = batch_name(after)
    progress.set_phase(f"writing batch {batch}")
    # a run killed before its checkpoint left part of this batch: drop it, then write it whole;
    # that includes task output it committed under _temporary, which the next job's commit
    # would otherwise merge into the output (one export per output directory runs at a time)
    for output in ("events", "malformed"):
        storage.delete_glob(f"{output}/_temporary")
    storage.delete_glob(f"events/day=*/queue=*/batch={batch}")
    storage.delete_glob(f"malformed/batch={batch}")
    storage.delete_glob(STAGING)
    had_events = storage.exists("events")
    # one pass: the good records are written as they are read and validated, and the batch is
    # counted on the way (no copy of the batch, no job of its own for the counts)
    observed, counts = dlx_records.counted(validated)
    events = dlx_records.events(observed, batch)
    events.write.mode("append").partitionBy("day", "queue", "batch").parquet(storage.uri("events"))
    stats = counts.get
    if end_id is None:
        last = stats["last"]
        if last is None:  # nothing after the checkpoint: the output stays as it was
            if not had_events:
                storage.delete_glob("events")
            return None
        end_id = dlx_source.format_id(last["id_ms"], last["id_seq"])
    _write_malformed(spark, storage, validated, batch, stats)
    by_reason = {code: stats[code] for code in dlx_records.REASON_CODES if stats[code]}
    return Batch(
        batch, after, end_id, stats["good"], sum(by_reason.values()), by_reason, range_count
    )


def _write_malformed(
    spark: Any, storage: dlx_storage.Storage, validated: Any, batch: str, stats: dict[str, Any]
) -> None:
    """Append the batch's malformed records to ``OUT/malformed``. They are rare: a batch without
    any reads nothing more (an empty write keeps ``OUT/malformed`` readable), and one with some
    is read a second time for them and must count the same as its first read. In the batch's id
    ranges, entries can be deleted from the stream but never added or changed, so equal counts
    are the same records; a snapshot replaced meanwhile is caught the same way.

    Raises:
        ExportError: the second read counted otherwise (nothing is committed; rerun the export).
    """
    uri = storage.uri("malformed")
    if not any(stats[code] for code in dlx_records.REASON_CODES):
        empty = spark.createDataFrame([], dlx_records.MALFORMED_SCHEMA)
        empty.write.mode("append").partitionBy("batch").parquet(uri)
        return
    observed, counts = dlx_records.counted(validated)
    bad = dlx_records.malformed(observed, batch)
    bad.write.mode("append").partitionBy("batch").parquet(uri)
    if counts.get != stats:
        raise ExportError(
            f"the records of batch {batch} changed between the export's two reads of them "
            f"(entries deleted from the stream, or the snapshot replaced); nothing was "
            f"committed: run the export again"
        )


def commit(
    storage: dlx_storage.Storage, checkpoint: dlx_storage.Checkpoint, batch: Batch
) -> dlx_storage.Checkpoint:
    """Advance the checkpoint past the batch, refusing if another run moved it meanwhile."""
    current = dlx_storage.read_checkpoint(storage)
    if (current.last_id if current else None) != batch.after:
        raise ExportError(
            f"the checkpoint in --out moved during this export (another export wrote "
            f"{storage.uri(dlx_storage.CHECKPOINT)}); run one export per output directory"
        )
    checkpoint.last_id = batch.end_id
    checkpoint.exported += batch.records
    checkpoint.malformed += batch.malformed
    checkpoint.batches += 1
    dlx_storage.write_checkpoint(storage, checkpoint)
    return checkpoint


def _aggregate(
    spark: Any, options: ExportOptions, storage: dlx_storage.Storage, progress: Progress
) -> dict[str, Any]:
    """Recompute aggregates, top causes, summary and chart from every exported event."""
    from pyspark import StorageLevel

    progress.set_phase("aggregating")
    reader = spark.read.schema(dlx_records.EVENTS_SCHEMA).option("basePath", storage.uri("events"))
    events = reader.parquet(storage.uri("events"))
    # the one pass over every event (shuffled once, by message); the aggregates, the summary and
    # the chart's window come from these persisted facts, the top causes from the daily rows
    facts = dlx_aggregates.message_facts(events).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        daily = dlx_aggregates.aggregate(facts, dlx_aggregates.DAY_KEYS)
        daily.write.mode("overwrite").partitionBy("day").parquet(storage.uri("aggregates"))
        written = spark.read.parquet(storage.uri("aggregates"))
        top = dlx_aggregates.top_causes(written, options.top_causes)
        top.write.mode("overwrite").partitionBy("day").parquet(storage.uri("top_causes"))
        progress.set_phase("summary and chart")
        totals, rows = dlx_aggregates.summary_rows(facts, options.summary_rows)
        bounds = dlx_aggregates.failure_bounds(facts)
    finally:
        facts.unpersist()
    hourly = dlx_chart.hourly_failures(events, options.chart_days, bounds=bounds)
    storage.write_atomic(CHART, dlx_chart.render_png(hourly, dlx_chart.title(hourly)))
    return {"totals": totals, "rows": rows, "chart": storage.uri(CHART)}


def export(spark: Any, options: ExportOptions) -> dict[str, Any]:
    """Run one export with an existing SparkSession; returns the result (also written to
    ``OUT/_last_export.json``).

    Raises:
        ExportError: bad options, or the output directory belongs to another stream or was
            changed by a concurrent export.
        dlx_stream.LockedError: another export of the same stream is running.
        dlx_storage.CheckpointError: the checkpoint file in ``out`` cannot be read.
    """
    options.check()
    started = time.monotonic()
    ship_modules(spark)
    storage = dlx_storage.open_storage(spark, options.out)
    key = dlx_source.history_key(options.prefix)
    client = (
        None
        if options.redis_url is None or options.snapshot
        else dlx_source.connect(options.redis_url)
    )
    counter = spark.sparkContext.accumulator(0)
    result: dict[str, Any] = {
        "stream": key,
        "out": options.out,
        "trimmed": None,
        "master": spark.sparkContext.master,
        "app_id": spark.sparkContext.applicationId,
    }
    with ExitStack() as stack:
        if client is not None:
            stack.callback(client.close)
            stack.enter_context(dlx_stream.ExportLock(client, key))
        progress = stack.enter_context(Progress(spark, counter, enabled=options.progress))
        checkpoint = dlx_storage.read_checkpoint(storage) or dlx_storage.Checkpoint(stream=key)
        if checkpoint.stream != key:
            raise ExportError(
                f"--out {options.out} holds the export of {checkpoint.stream}, not {key}: "
                f"use another --out or the matching --prefix"
            )
        batch = write_batch(
            spark, options, storage, client, key, checkpoint.last_id, counter, progress
        )
        exported_s = time.monotonic() - started
        if batch is not None:
            progress.set_phase("committing the checkpoint")
            checkpoint = commit(storage, checkpoint, batch)
            if client is not None and options.mirror:
                dlx_stream.mirror_checkpoint(client, key, _mirror_fields(checkpoint, options))
            if client is not None and options.trim:
                progress.set_phase("trimming the stream")
                result["trimmed"] = dlx_stream.trim(client, key, batch.end_id)
        stale = checkpoint.last_id is not None and checkpoint.aggregated_id != checkpoint.last_id
        if options.aggregates and stale:
            result["summary"] = _aggregate(spark, options, storage, progress)
            checkpoint.aggregated_id = checkpoint.last_id or ""
            dlx_storage.write_checkpoint(storage, checkpoint)
        progress.set_phase("done")
    total_s = time.monotonic() - started
    result.update(_batch_fields(batch, spark))
    result.update(
        checkpoint=asdict(checkpoint),
        seconds={"export": round(exported_s, 3), "total": round(total_s, 3)},
        records_per_s=round(_processed(batch) / exported_s, 1) if batch else 0.0,
    )
    storage.write_atomic(LAST_RUN, json.dumps(result, indent=2, default=str).encode("utf-8"))
    return result


def _processed(batch: Batch | None) -> int:
    return 0 if batch is None else batch.records + batch.malformed


def _batch_fields(batch: Batch | None, spark: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "status": "up-to-date" if batch is None else "exported",
        "cores": spark.sparkContext.defaultParallelism,
    }
    if batch is None:
        fields.update(batch=None, records=0, malformed=0, malformed_by_reason={})
        return fields
    fields.update(
        batch=batch.name,
        start_after=batch.after,
        end_id=batch.end_id,
        records=batch.records,
        malformed=batch.malformed,
        malformed_by_reason=batch.by_reason,
        ranges=batch.ranges,
    )
    return fields


def _mirror_fields(checkpoint: dlx_storage.Checkpoint, options: ExportOptions) -> dict[str, str]:
    return {
        "last_id": checkpoint.last_id or "",
        "exported": str(checkpoint.exported),
        "malformed": str(checkpoint.malformed),
        "batches": str(checkpoint.batches),
        "updated_ms": str(checkpoint.updated_ms),
        "out": options.out,
    }


def format_result(result: dict[str, Any]) -> str:
    """What a person reads after a run: the batch, malformed reasons, the summary table."""
    lines = []
    if result["status"] == "exported":
        lines.append(
            f"exported batch {result['batch']}: {result['records']:,} records, "
            f"{result['malformed']:,} malformed, up to id {result['end_id']} "
            f"({result['records_per_s']:,.0f} records/s on {result['cores']} cores"
            f"{' of ' + result['master'] if result.get('master') else ''})"
        )
        for code, count in sorted(result["malformed_by_reason"].items()):
            lines.append(f"  malformed {code}: {count:,} (see {result['out']}/malformed)")
    else:
        lines.append(f"nothing new after {result['checkpoint']['last_id'] or 'the start'}")
    if result.get("trimmed") is not None:
        lines.append(f"trimmed {result['trimmed']:,} entries from {result['stream']}")
    summary = result.get("summary")
    if summary:
        lines.append("")
        lines.append(dlx_aggregates.format_table(summary["totals"], summary["rows"]))
        lines.append("")
        lines.append(f"chart: {summary['chart']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="celery_dlx_spark", description=__doc__.split("\n")[0])
    source = parser.add_argument_group("source")
    source.add_argument("--redis-url", help="Redis with the history stream (dlx_redis_url)")
    source.add_argument("--prefix", default="dlx", help="celery_dlx key prefix (dlx_key_prefix)")
    source.add_argument("--snapshot", help="read a JSON-lines snapshot (path or glob) instead")
    parser.add_argument("--out", required=True, help="output directory (path or Hadoop URI)")
    parser.add_argument(
        "--master",
        help="Spark master of a plain python run (default: spark-defaults.conf's, else local[*]); "
        "under spark-submit, give spark-submit's --master",
    )
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--ranges", type=int, help="id ranges read in parallel")
    parser.add_argument("--page-size", type=int, default=5000, help="entries per XRANGE")
    parser.add_argument("--trim", action="store_true", help="trim the stream after the export")
    parser.add_argument("--no-mirror", action="store_true", help="no checkpoint copy in Redis")
    parser.add_argument("--no-aggregates", action="store_true", help="export only")
    parser.add_argument("--top-causes", type=int, default=5)
    parser.add_argument("--summary-rows", type=int, default=20)
    parser.add_argument("--chart-days", type=float, default=7.0)
    parser.add_argument("--result-json", help="also write the result to this local file")
    parser.add_argument("--quiet", action="store_true", help="no progress, no summary")
    return parser.parse_args(argv)


def options_from_args(args: argparse.Namespace) -> ExportOptions:
    return ExportOptions(
        out=args.out,
        redis_url=args.redis_url,
        prefix=args.prefix,
        snapshot=args.snapshot,
        ranges=args.ranges,
        page_size=args.page_size,
        trim=args.trim,
        mirror=not args.no_mirror,
        aggregates=not args.no_aggregates,
        top_causes=args.top_causes,
        summary_rows=args.summary_rows,
        chart_days=args.chart_days,
        progress=not args.quiet,
    )


def choose_master(requested: str | None, configured: str | None, submitted: bool) -> str:
    """The master the job runs on: spark-submit's when spark-submit started it, else the job's
    ``--master``, else the configured one, else ``local[*]``.

    Args:
        requested: the job's own ``--master`` (or ``--conf spark.master=...``), if any.
        configured: ``spark.master`` as the JVM sees it: spark-submit's ``--master`` or
            ``--conf``, ``spark-defaults.conf``, ``$MASTER``.
        submitted: spark-submit started this driver (it always sets a master, ``local[*]`` by
            default), so its master is the one the user chose.

    Raises:
        ExportError: under spark-submit, a job ``--master`` that is not spark-submit's.
    """
    if submitted and requested and configured and requested != configured:
        raise ExportError(
            f"--master {requested} was given to the job, but spark-submit runs it on "
            f"{configured}: give the master to spark-submit's --master instead"
        )
    if submitted:
        return configured or requested or DEFAULT_MASTER
    return requested or configured or DEFAULT_MASTER


def build_session(master: str | None, conf: list[str]) -> Any:
    """A SparkSession on the master :func:`choose_master` picks; a master set by spark-submit,
    SparkConf or ``spark-defaults.conf`` is never replaced.

    Raises:
        ExportError: see :func:`choose_master`.
    """
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    settings = dict(item.split("=", 1) for item in conf)
    requested = master or settings.pop("spark.master", None)
    # spark-submit hands its driver the gateway of its own JVM, whose system properties hold
    # spark-submit's --master, --conf and spark-defaults.conf: join (or, run with plain python,
    # start) that JVM first, so SparkConf sees them before anything decides the master
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    join_gateway()
    configured = SparkConf().get("spark.master", None)
    chosen = choose_master(requested, configured, submitted)
    builder = SparkSession.builder.appName("celery-dlx-export")
    if chosen != configured:
        builder = builder.master(chosen)
    if chosen.startswith("local"):
        # local workers must be this interpreter (it has redis-py), not whatever python3 is
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        settings.setdefault("spark.sql.shuffle.partitions", str(max(4, 2 * (os.cpu_count() or 1))))
        # a local run talks to itself only: keep the driver on loopback
        settings.setdefault("spark.driver.host", "127.0.0.1")
        settings.setdefault("spark.driver.bindAddress", "127.0.0.1")
    settings.setdefault("spark.sql.session.timeZone", "UTC")
    settings.setdefault("spark.ui.showConsoleProgress", "false")
    for name, value in settings.items():
        builder = builder.config(name, value)
    return builder.getOrCreate()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    options = options_from_args(args)
    try:
        options.check()
        if any("=" not in item for item in args.conf):
            raise ExportError("--conf takes KEY=VALUE")
    except ExportError as exc:
        print(f"dlx export: {exc}", file=sys.stderr)
        return 2
    try:
        spark = build_session(args.master, args.conf)
    except ExportError as exc:
        print(f"dlx export: {exc}", file=sys.stderr)
        _write_result(args.result_json, {"status": "failed", "error": str(exc)})
        return 2
    spark.sparkContext.setLogLevel("WARN")
    if not args.quiet:
        print(f"dlx export: {describe(spark)}", file=sys.stderr, flush=True)
    try:
        result = export(spark, options)
    except (ExportError, dlx_stream.LockedError, dlx_storage.CheckpointError) as exc:
        result = {"status": "failed", "error": str(exc)}
        print(f"dlx export: {exc}", file=sys.stderr)
    except Exception as exc:  # reported to the launcher through --result-json, then shown whole
        result = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        traceback.print_exc()
    finally:
        spark.stop()
    _write_result(args.result_json, result)
    if result["status"] == "failed":
        return 1
    if not args.quiet:
        print(format_result(result))
    return 0


def describe(spark: Any) -> str:
    """Where the job runs: its master and application id (the id the cluster's UI shows)."""
    context = spark.sparkContext
    return f"running on {context.master} as application {context.applicationId}"


def _write_result(path: str | None, result: dict[str, Any]) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2, default=str)


if __name__ == "__main__":
    sys.exit(main())
