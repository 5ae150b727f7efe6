"""P7 Spark export: records per second at 100k and 1M history records, after JVM start.

Generates a realistic failure history (14 days, 6 queues, 30 tasks, 60 causes; requeue, park,
drain, bury, recover and replay chains), exports it with the job ``celery_dlx_spark`` on a
``local[N]`` SparkSession started (and warmed on a small export) before timing, and prints:

* ``export``: read + validate + Parquet write + checkpoint, the part that must scale with the
  history (target >= 50k records/s per core);
* ``with aggregates``: the same records exported again, into a new directory, with the aggregates,
  top causes, summary and chart, in one run, as ``celery dlx export`` runs by default;
* the ratio of the 1M rate to the 100k rate (1.0 = cost grows linearly);
* ``bare``: a bare Spark job over the same records in the same round: Spark's JSON reader on
  the same JSON-lines snapshot (the same all-string schema), the ``day`` column derived, written
  as Parquet partitioned the same way (``day``, ``queue``, ``batch``), no validation, no
  checkpoint, no aggregates. The headline (issue 23 item 5) is the export, aggregates included,
  as a ratio to it: ``bare seconds / (export with aggregates seconds)``, the median of the rounds'
  ratios at the largest size (target >= 0.70x), with the records/s per core beside it;
* ``floor``: a second baseline in the same round (skipped with ``--no-floor``): the bare job,
  plus the least the aggregates need, in one timed run over one DataFrame (read from the JSON
  once and persisted in memory): one ``groupBy("message_id")`` of all records with
  ``min(at_ms)``, ``max(at_ms)`` (at_ms cast to long, as the export's schema has it) and a count
  of the ``recovered`` rows, written as unpartitioned Parquet. The aggregates are per-message
  facts (a retry success rate and a time to recovery need each message's whole chain), so no
  export with them can skip this shuffle of every record: ``bare seconds / floor seconds`` is the
  best headline ratio any such export could reach, and ``floor seconds / (export with
  aggregates seconds)`` is how close this one is to that floor (the two multiply to the headline). Each
  round line shows both; a ``FLOOR P7`` line after each ``RATIO P7`` line gives their medians
  over the rounds (no SUMMARY row: the table keeps the headline alone).

``--standalone`` then runs the largest size again (same rounds, same bare and floor baselines) on
a private 2-worker Spark standalone cluster started from pip's pyspark
(``tests/spark/standalone.py``; one core and 1 GB per worker, free loopback ports, stopped by PID).

Sources: ``jsonl`` (a JSON-lines snapshot, read by Spark's JSON reader) and ``redis`` (the stream
read in id ranges by the executors, from a redis-server this script starts on a free loopback
port, so a million entries never load the shared Redis).

Run: .venv/bin/python benchmarks/p7_spark.py [--sizes 100000,1000000] [--sources jsonl,redis]
     [--cores 2] [--rounds 3] [--standalone | --standalone-only] [--no-floor]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import load, median, rounds_list, summary  # noqa: E402

DAY0 = 1709510400000  # 2024-03-04T00:00:00Z
SPAN_MS = 14 * 86400000
QUEUES = ("orders", "emails", "billing", "search", "reports", "legacy")


def events(count: int) -> Iterator[tuple[str, dict[str, str]]]:
    """``count`` history entries with increasing ids, as failure chains of a few events each."""
    seq = 0
    message = 0
    while seq < count:
        message += 1
        task = message % 30
        queue = QUEUES[task % len(QUEUES)]
        cause = (message * 7) % 60
        at = DAY0 + (seq * SPAN_MS) // count
        base = {
            "queue": queue,
            "task": f"svc{task}.tasks.job{task}",
            "message_id": f"m{message:09d}",
            "cause": f"{cause:016x}",
            "exc_type": f"svc.errors.Error{cause % 12}",
            "reason": "",
            "importance": "notify",
            "first_failure_ms": str(at),
        }
        kind = message % 10
        chain = [("requeued", ""), ("recovered", "")] if kind < 5 else [("requeued", "")]
        if kind >= 5:
            chain += [("parked", "30.000"), ("drained", "")]
            chain += [("recovered", "")] if kind < 8 else [("buried", ""), ("replayed", "")]
        for step, (fate, delay) in enumerate(chain):
            if seq >= count:
                return
            fields = dict(base, fate=fate, at_ms=str(at + step * 1000), delay=delay)
            fields["attempt"] = str(min(step + 1, 3))
            yield f"{at + step * 1000}-{seq}", fields
            seq += 1


def write_jsonl(path: Path, count: int) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for entry_id, fields in events(count):
            handle.write(json.dumps({"id": entry_id, **fields}, separators=(",", ":")) + "\n")


def fill_redis(client: Any, key: str, count: int) -> None:
    pipe = client.pipeline(transaction=False)
    for n, (entry_id, fields) in enumerate(events(count), 1):
        pipe.xadd(key, fields, id=entry_id)
        if n % 5000 == 0:
            pipe.execute()
    pipe.execute()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def own_redis(workdir: Path) -> Iterator[str]:
    """A throwaway redis-server on loopback, without persistence."""
    import redis

    port = _free_port()
    server = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


#: The headline: the export with its aggregates / the bare Spark job, at the largest size.
RATIO_TARGET = 0.70


def session(cores: int, master: str | None = None) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master or f"local[{cores}]")
    if master:  # a standalone cluster: one 1-core executor per worker
        builder = builder.config("spark.executor.cores", "1").config("spark.cores.max", str(cores))
        builder = builder.config("spark.executor.memory", "768m")
    spark = (
        builder.appName("p7-spark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(max(4, 2 * cores)))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "3g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def tree_cpu() -> float:
    """CPU seconds used so far by this process and its children (the JVM, the Python workers):
    on a shared machine, records per CPU-second is the per-core rate the others do not skew."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def timed(spark: Any, options: Any) -> tuple[dict[str, Any], float, float]:
    from celery_dlx_spark import export as dlx_export

    wall, cpu = time.monotonic(), tree_cpu()
    result = dlx_export.export(spark, options)
    return result, time.monotonic() - wall, tree_cpu() - cpu


def bare_job(spark: Any, snapshot: Path, out: Path) -> tuple[float, float]:
    """The same records read by Spark's JSON reader and written as Parquet partitioned like the
    export's events (``day``, ``queue``, ``batch``): nothing else. Wall and CPU seconds."""
    wall, cpu = time.monotonic(), tree_cpu()
    frame = bare_frame(spark, snapshot)
    frame.write.mode("overwrite").partitionBy("day", "queue", "batch").parquet(str(out))
    return time.monotonic() - wall, tree_cpu() - cpu


def bare_frame(spark: Any, snapshot: Path) -> Any:
    """The bare job's DataFrame: the snapshot with the all-string schema, ``day`` and ``batch``."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from celery_dlx_spark.source import RAW_COLUMNS

    schema = T.StructType([T.StructField(name, T.StringType()) for name in RAW_COLUMNS])
    frame = spark.read.schema(schema).json(str(snapshot))
    day = F.date_add(
        F.lit("1970-01-01").cast("date"),
        F.floor(F.col("at_ms").cast("long") / 86400000).cast("int"),
    )
    return frame.withColumn("day", day.cast("string")).withColumn("batch", F.lit("b0"))


def floor_job(spark: Any, snapshot: Path, out: Path) -> tuple[float, float]:
    """The bare job plus the least the aggregates need, from one DataFrame read once: the bare
    job's partitioned write, then one shuffle of every record by ``message_id`` (first and last
    ``at_ms``, count of ``recovered`` rows) written as unpartitioned Parquet. Wall and CPU
    seconds of the whole."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    wall, cpu = time.monotonic(), tree_cpu()
    # In memory, spilling to local disk only what does not fit: the JSON is parsed once.
    frame = bare_frame(spark, snapshot).persist(StorageLevel.MEMORY_AND_DISK_DESER)
    try:
        events_out = str(out / "events")
        frame.write.mode("overwrite").partitionBy("day", "queue", "batch").parquet(events_out)
        at_ms = F.col("at_ms").cast("long")
        facts = frame.groupBy("message_id").agg(
            F.min(at_ms).alias("first_ms"),
            F.max(at_ms).alias("last_ms"),
            F.count_if(F.col("fate") == "recovered").alias("recovered"),
        )
        facts.write.mode("overwrite").parquet(str(out / "messages"))
    finally:
        frame.unpersist(blocking=True)
    return time.monotonic() - wall, tree_cpu() - cpu


def run_one(
    spark: Any, workdir: Path, source: str, count: int, redis_url: str | None, floor: bool = True
) -> dict[str, float]:
    """Export ``count`` records, then recompute the aggregates, then run the bare job (and, with
    ``floor``, the floor job) on the same records; wall and CPU seconds of each."""
    import redis

    from celery_dlx_spark import export as dlx_export

    out = workdir / f"out-{source}-{count}"
    prefix = f"p7-{count}"
    key = "{" + prefix + "}:history"
    snapshot = workdir / f"history-{count}.jsonl"
    write_jsonl(snapshot, count)  # the bare job's input, and the jsonl source's
    if source == "jsonl":
        options = dlx_export.ExportOptions(out=str(out), snapshot=str(snapshot), prefix=prefix)
    else:
        assert redis_url is not None
        client = redis.Redis.from_url(redis_url)
        fill_redis(client, key, count)
        options = dlx_export.ExportOptions(out=str(out), redis_url=redis_url, prefix=prefix)
    options.progress = False
    options.aggregates = False
    whole_out = workdir / f"whole-{source}-{count}"
    try:
        result, export_s, export_cpu = timed(spark, options)
        assert result["records"] == count, result
        # The headline's run: the same records exported again into a new directory with their
        # aggregates, in one run, as `celery dlx export` runs by default. (Timing a second run
        # over the first one's output instead, as before 2026-11-27, made a JSON-lines snapshot
        # be read and validated twice.)
        whole = replace(options, out=str(whole_out), aggregates=True)
        result, whole_s, whole_cpu = timed(spark, whole)
        assert result["records"] == count, result
        bare_s, bare_cpu = bare_job(spark, snapshot, workdir / f"bare-{source}-{count}")
        if floor:
            floor_s, floor_cpu = floor_job(spark, snapshot, workdir / f"floor-{source}-{count}")
    finally:
        shutil.rmtree(workdir / f"bare-{source}-{count}", ignore_errors=True)
        shutil.rmtree(workdir / f"floor-{source}-{count}", ignore_errors=True)
        snapshot.unlink(missing_ok=True)
        if source == "redis":
            client.delete(key, key + ":export")
            client.close()
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(whole_out, ignore_errors=True)
    got = {
        "export_s": export_s,
        "export_cpu": export_cpu,
        "whole_s": whole_s,
        "whole_cpu": whole_cpu,
        "bare_s": bare_s,
        "bare_cpu": bare_cpu,
    }
    if floor:
        got.update(floor_s=floor_s, floor_cpu=floor_cpu)
    return got


def summarize(source: str, small: int, large: int, best: dict[int, dict[str, float]]) -> None:
    """The ratio of the rates (>= 1: cost grows at most linearly) and the cost split into a fixed
    part per run and a part per record, from the two sizes."""
    rate = {count: count / best[count]["export_s"] for count in (small, large)}
    per_record = (best[large]["export_s"] - best[small]["export_s"]) / (large - small)
    fixed = best[small]["export_s"] - per_record * small
    cpu_per_record = (best[large]["export_cpu"] - best[small]["export_cpu"]) / (large - small)
    print(
        f"  {source:5s} ratio: rate at {large:,} / rate at {small:,} = "
        f"{rate[large] / rate[small]:.2f}; cost = {fixed:.1f}s per run + "
        f"{per_record * 1e6:.1f}us per record (marginal {1 / per_record:,.0f} records/s, "
        f"{1 / cpu_per_record:,.0f} records per CPU-s)"
    )


def report(source: str, count: int, cores: int, got: dict[str, float]) -> float:
    """Print one line; returns the export's wall-clock rate."""
    rate = count / got["export_s"]
    print(
        f"  {source:5s} {count:>9,} records: export {got['export_s']:6.1f}s wall = "
        f"{rate:>8,.0f}/s ({rate / cores:>7,.0f}/s per core), {got['export_cpu']:6.1f} CPU-s = "
        f"{count / got['export_cpu']:>7,.0f} records per CPU-s; with aggregates "
        f"{got['whole_s']:5.1f}s = {count / got['whole_s']:>8,.0f}/s"
    )
    return rate


def measure(
    spark: Any,
    workdir: Path,
    source: str,
    count: int,
    cores: int,
    rounds: int,
    redis_url: str,
    floor: bool = True,
) -> tuple[list[dict[str, float]], dict[str, float]]:
    """``rounds`` runs of one size; every run printed, the median run (by export time) kept."""
    runs = []
    for n in range(1, rounds + 1):
        got = run_one(spark, workdir, source, count, redis_url, floor)
        runs.append(got)
        whole = got["whole_s"]
        floor_text = ""
        if "floor_s" in got:
            floor_text = (
                f"; floor job (bare + one shuffle by message) {got['floor_s']:.1f}s, "
                f"{got['floor_cpu']:.1f} CPU-s -> bare / floor "
                f"{got['bare_s'] / got['floor_s']:.2f}x, floor / (export with aggregates) "
                f"{got['floor_s'] / whole:.2f}x (of seconds)"
            )
        print(
            f"round {n}: {source} {count:,}: export {got['export_s']:.1f}s = "
            f"{count / got['export_s'] / cores:,.0f}/s per core, {got['export_cpu']:.1f} CPU-s; "
            f"with aggregates (one run) {whole:.1f}s, {got['whole_cpu']:.1f} CPU-s; bare Spark "
            f"job {got['bare_s']:.1f}s "
            f"({count / got['bare_s'] / cores:,.0f}/s per core) -> export with aggregates / "
            f"bare {got['bare_s'] / whole:.2f}x{floor_text}  [load {load()}]",
            flush=True,
        )
    return runs, sorted(runs, key=lambda r: r["export_s"])[len(runs) // 2]


def ratio_summary(
    source: str, count: int, cores: int, where: str, runs: list[dict[str, float]]
) -> None:
    """The headline row: the export with its aggregates (one run) as a ratio to the bare job, per core beside it."""
    ratios = [r["bare_s"] / r["whole_s"] for r in runs]
    per_core = [count / r["whole_s"] / cores for r in runs]
    bare_core = [count / r["bare_s"] / cores for r in runs]
    ratio = median(ratios)
    met = ratio >= RATIO_TARGET
    print(
        f"RATIO P7 export with aggregates / bare Spark job ({source}, {count:,}, {where}): "
        f"{ratio:.2f}x ({rounds_list(ratios)}) (target >= {RATIO_TARGET}x) "
        f"{'OK' if met else 'BELOW'}; {median(per_core):,.0f}/s per core with aggregates, bare "
        f"{median(bare_core):,.0f}/s per core",
        flush=True,
    )
    if all("floor_s" in r for r in runs):
        floor_summary(source, count, cores, where, runs)
    summary(
        "P7",
        f"Spark export ({source}) with aggregates / a bare Spark job (same records read from "
        f"JSON lines, written as Parquet partitioned by day, queue, batch), {count:,} records, "
        f"{where}",
        f">= {RATIO_TARGET}x",
        f"{ratio:.2f}x ({rounds_list(ratios)}); export with aggregates "
        f"{median(per_core):,.0f}/s per core, bare {median(bare_core):,.0f}/s per core",
        "met" if met else "not met",
    )


def floor_summary(
    source: str, count: int, cores: int, where: str, runs: list[dict[str, float]]
) -> None:
    """After the headline: the floor job against the bare job (the best headline any export with
    these aggregates could reach) and against the export with aggregates. Starts with ``FLOOR``,
    not ``RATIO`` or ``SUMMARY``: a line to read, not a row of the table."""
    best = [r["bare_s"] / r["floor_s"] for r in runs]
    reached = [r["floor_s"] / r["whole_s"] for r in runs]
    floor_core = [count / r["floor_s"] / cores for r in runs]
    print(
        f"FLOOR P7 floor job (bare + one shuffle by message_id) ({source}, {count:,}, {where}): "
        f"bare / floor seconds {median(best):.2f}x ({rounds_list(best)}) = the best headline an "
        f"export with these aggregates could reach; floor / (export with aggregates) seconds "
        f"{median(reached):.2f}x ({rounds_list(reached)}); floor "
        f"{median(floor_core):,.0f}/s per core",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--sources", default="jsonl,redis")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--rounds", type=int, default=3, help="runs per size; the median is kept")
    parser.add_argument(
        "--standalone",
        action="store_true",
        help="also run the largest size on a private 2-worker Spark standalone cluster",
    )
    parser.add_argument(
        "--standalone-only",
        action="store_true",
        help="only the standalone cluster's runs (its own run_all piece, P7S)",
    )
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the floor job (the bare job plus one shuffle of every record by message)",
    )
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    sources = args.sources.split(",")
    workdir = Path(tempfile.mkdtemp(prefix="p7-"))
    try:
        with own_redis(workdir) as redis_url:
            if not args.standalone_only:
                local_runs(args, sizes, sources, workdir, redis_url)
            if args.standalone or args.standalone_only:
                standalone_runs(args, sizes[-1], sources, workdir, redis_url)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def local_runs(
    args: argparse.Namespace, sizes: list[int], sources: list[str], workdir: Path, redis_url: str
) -> None:
    """Every size and source on ``local[cores]``, with the bare job beside each run."""
    started = time.monotonic()
    spark = session(args.cores)
    print(f"P7 spark export: local[{args.cores}], JVM up in {time.monotonic() - started:.1f}s")
    try:
        for source in sources:
            # warm the JIT and the workers
            run_one(spark, workdir, source, 5000, redis_url, args.floor)
            best: dict[int, dict[str, float]] = {}
            for count in sizes:
                runs, best[count] = measure(
                    spark, workdir, source, count, args.cores, args.rounds, redis_url, args.floor
                )
                report(source, count, args.cores, best[count])
                per_core = [count / r["export_s"] / args.cores for r in runs]
                if count == sizes[-1]:
                    ratio_summary(source, count, args.cores, f"local[{args.cores}]", runs)
                    summary(
                        "P7",
                        f"Spark export ({source}) records/s per core, wall clock, {count:,} "
                        f"records, local[{args.cores}] (export alone, no aggregates)",
                        "measured (the ratio row is the target)",
                        f"{median(per_core):,.0f}/core ({rounds_list(per_core, '{:,.0f}')}); "
                        f"{count / best[count]['export_cpu']:,.0f} records per CPU-s",
                        "measured",
                    )
            if len(sizes) >= 2:
                summarize(source, sizes[0], sizes[-1], best)
    finally:
        spark.stop()


def standalone_runs(
    args: argparse.Namespace, count: int, sources: list[str], workdir: Path, redis_url: str
) -> None:
    """The largest size on a private 2-worker standalone cluster, then the cluster stopped."""
    from tests.spark.standalone import spark_standalone

    with spark_standalone(workdir / "standalone", workers=2) as cluster:
        started = time.monotonic()
        spark = session(2, cluster.url)
        print(
            f"P7 on a 2-worker standalone cluster {cluster.url}: session up in "
            f"{time.monotonic() - started:.1f}s",
            flush=True,
        )
        try:
            for source in sources:
                run_one(spark, workdir, source, 5000, redis_url, args.floor)
                runs, best = measure(
                    spark, workdir, source, count, 2, args.rounds, redis_url, args.floor
                )
                report(source, count, 2, best)
                ratio_summary(source, count, 2, "standalone cluster, 2 workers x 1 core", runs)
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
