"""Launch the Spark exporter of the failure history (the rest of this package) with spark-submit.

The export is a PySpark job (see ``spark/README.md``) shipped in the wheel as the top-level package
``celery_dlx_spark``, which never imports Celery or ``celery_dlx``, so the cluster needs neither.
This module alone is the exception: it runs in the app's process, and is not shipped. The job reads the history stream in id ranges on the executors, writes Parquet partitioned by day
and queue, keeps a checkpoint so reruns resume, and recomputes the aggregates and the chart. This
launcher zips the package for ``--py-files`` and writes its entry script at run time, for
``celery -A proj dlx export`` and for code::

    from celery_dlx import run_export

    result = run_export(app, out="/data/dlx-history", master="local[*]", trim=True)
    print(result.records, result.malformed, result.summary[:3])

The Redis URL and key prefix come from the app's ``dlx_redis_url`` and ``dlx_key_prefix`` unless
given. The job runs in its own process (its own JVM), so a failed export never takes the caller
down; its result comes back through a JSON file.
"""

from __future__ import annotations

import collections
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any, Protocol, TypedDict

from celery import Celery

from celery_dlx.errors import DLXError

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; only annotations use it
    from typing_extensions import Unpack

#: Environment variable naming an entry file to run instead of the generated one.
JOB_ENV = "CELERY_DLX_SPARK_JOB"
#: The job's package (top level, beside ``celery_dlx``; the ``spark`` extra installs its deps).
JOB_PACKAGE = "celery_dlx_spark"
#: Lines of the job's output kept to explain a failure.
OUTPUT_TAIL = 40


class ExportError(DLXError):
    """The export could not be started or did not finish; the message says why."""


class SparkOptions(TypedDict, total=False):
    """The options of :func:`run_export` passed on to :func:`build_spark_submit_command`."""

    ranges: int | None
    page_size: int | None
    aggregates: bool
    mirror: bool
    top_causes: int | None
    summary_rows: int | None
    chart_days: float | None
    quiet: bool
    conf: Mapping[str, str] | None
    spark_submit: str | None
    job: str | os.PathLike[str] | None
    workdir: str | os.PathLike[str] | None


@dataclass(frozen=True)
class ExportResult:
    """What one export did.

    Attributes:
        status: ``exported`` (a batch was written) or ``up-to-date`` (nothing new).
        records: good history records exported by this run.
        malformed: malformed records found by this run (kept in ``OUT/malformed``).
        malformed_by_reason: malformed records per reason code.
        batch: the batch written (named after the checkpoint it started from), or None.
        end_id: the last stream id exported by this run, or None.
        trimmed: stream entries removed by ``trim``, or None when not trimmed.
        out: the output directory.
        chart: the PNG chart's path when the aggregates were recomputed, else None.
        totals: whole-history aggregate (failures, retry success rate, ...), or {}.
        summary: top (queue, task, cause) aggregate rows, most failures first, or [].
        checkpoint: the checkpoint after the run (``last_id``, ``exported``, ``malformed``...).
        seconds: ``export`` (read, validate, write) and ``total`` wall time of the job.
        records_per_s: records (good and malformed) exported per second by this run.
        cores: Spark's default parallelism (cores) the run had.
        master: the Spark master the job ran on (``local[*]``, ``spark://host:7077``, ``yarn``...).
        app_id: the Spark application id (as the cluster manager and its UI name it).
        command: the spark-submit command that ran.
        raw: the job's whole result.
    """

    status: str
    records: int
    malformed: int
    malformed_by_reason: dict[str, int]
    batch: str | None
    end_id: str | None
    trimmed: int | None
    out: str
    chart: str | None
    totals: dict[str, Any]
    summary: list[dict[str, Any]]
    checkpoint: dict[str, Any]
    seconds: dict[str, float]
    records_per_s: float
    cores: int
    master: str = ""
    app_id: str = ""
    command: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def exported(self) -> bool:
        """True when this run wrote a batch."""
        return self.status == "exported"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], command: Sequence[str] = ()) -> ExportResult:
        """Build a result from the job's JSON result (its ``result_json`` file)."""
        summary = data.get("summary") or {}
        trimmed = data.get("trimmed")
        return cls(
            status=str(data["status"]),
            records=int(data.get("records", 0)),
            malformed=int(data.get("malformed", 0)),
            malformed_by_reason={
                k: int(v) for k, v in (data.get("malformed_by_reason") or {}).items()
            },
            batch=data.get("batch"),
            end_id=data.get("end_id"),
            trimmed=None if trimmed is None else int(trimmed),
            out=str(data.get("out", "")),
            chart=summary.get("chart"),
            totals=dict(summary.get("totals") or {}),
            summary=list(summary.get("rows") or []),
            checkpoint=dict(data.get("checkpoint") or {}),
            seconds={k: float(v) for k, v in (data.get("seconds") or {}).items()},
            records_per_s=float(data.get("records_per_s", 0.0)),
            cores=int(data.get("cores", 0)),
            master=str(data.get("master", "")),
            app_id=str(data.get("app_id", "")),
            command=list(command),
            raw=dict(data),
        )


def job_package() -> ModuleType:
    """The job's package, ``celery_dlx_spark``, imported (it needs only the standard library).

    Raises:
        ExportError: it is not installed.
    """
    try:
        return importlib.import_module(JOB_PACKAGE)
    except ImportError as exc:
        raise ExportError(
            f"the Spark job package {JOB_PACKAGE} cannot be imported ({exc}): "
            "reinstall celery-dlx with the spark extra (pip install 'celery-dlx[spark]')"
        ) from exc


def package_job(workdir: str | os.PathLike[str] | None = None) -> tuple[Path, Path]:
    """Write the job's zip (``--py-files``) and entry script into ``workdir`` and return
    ``(entry, zip)``. Without ``workdir`` they go to a per-user cache directory named after the
    package's content, so a printed command stays runnable.
    """
    package = job_package()
    if workdir is None:
        digest = hashlib.sha256()
        for module in package.modules():
            digest.update(module.name.encode() + b"\0" + module.read_bytes())
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        workdir = cache / "celery-dlx" / f"spark-job-{digest.hexdigest()[:16]}"
    Path(workdir).mkdir(parents=True, exist_ok=True)
    archive: Path = package.build_zip(workdir)
    entry: Path = package.write_entry(workdir)
    return entry, archive


def find_job(
    job: str | os.PathLike[str] | None = None, workdir: str | os.PathLike[str] | None = None
) -> tuple[Path, Path]:
    """``(entry, zip)`` of the job: the package zipped by :func:`package_job`, run by ``job``
    if given, else by ``$CELERY_DLX_SPARK_JOB``, else by the generated entry script.

    Raises:
        ExportError: the given entry file does not exist, or the package is not installed.
    """
    entry, archive = package_job(workdir)
    given = job if job is not None else os.environ.get(JOB_ENV)
    if given:
        path = Path(given)
        if not path.is_file():
            raise ExportError(f"Spark job not found at {path} (job= or ${JOB_ENV})")
        entry = path.resolve()
    return entry, archive


def find_spark_submit(spark_submit: str | None = None) -> str:
    """The spark-submit to use: the given one, ``$SPARK_HOME/bin/spark-submit``, the one pip
    installed with pyspark next to this interpreter, or the one on PATH.

    Raises:
        ExportError: none was found.
    """
    if spark_submit:
        return spark_submit
    home = os.environ.get("SPARK_HOME")
    candidates = [Path(home) / "bin" / "spark-submit"] if home else []
    for candidate in [*candidates, Path(sys.executable).parent / "spark-submit"]:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    if found := shutil.which("spark-submit"):
        return found
    raise ExportError(
        "spark-submit not found: install the spark extra (pip install 'celery-dlx[spark]'), "
        "set SPARK_HOME, or pass spark_submit="
    )


def export_settings(app: Celery) -> tuple[str, str]:
    """``(dlx_redis_url, dlx_key_prefix)`` of a Celery app."""
    from celery_dlx.ops import get_runtime

    config = get_runtime(app).config
    return config.redis_url, config.key_prefix


def _job_args(options: Mapping[str, Any]) -> list[str]:
    """Job arguments for the options that differ from the job's defaults."""
    args: list[str] = []
    for name, value in options.items():
        if value is not None and value is not False:
            flag = "--" + name.replace("_", "-")
            args += [flag] if value is True else [flag, str(value)]
    return args


def build_spark_submit_command(
    *,
    out: str | os.PathLike[str],
    redis_url: str | None = None,
    key_prefix: str | None = None,
    snapshot: str | os.PathLike[str] | None = None,
    master: str = "local[*]",
    trim: bool = False,
    ranges: int | None = None,
    page_size: int | None = None,
    aggregates: bool = True,
    mirror: bool = True,
    top_causes: int | None = None,
    summary_rows: int | None = None,
    chart_days: float | None = None,
    quiet: bool = False,
    result_json: str | os.PathLike[str] | None = None,
    conf: Mapping[str, str] | None = None,
    spark_submit: str | None = None,
    job: str | os.PathLike[str] | None = None,
    workdir: str | os.PathLike[str] | None = None,
) -> list[str]:
    """The spark-submit command (argv list) that runs the export.

    Args:
        out: output directory (local path, or hdfs://, s3a://... on a cluster).
        redis_url: Redis holding the history stream (``dlx_redis_url``).
        key_prefix: celery_dlx key prefix (``dlx_key_prefix``); default ``dlx``.
        snapshot: read this JSON-lines snapshot (see :func:`dump_snapshot`) instead of Redis.
        master: Spark master, passed to spark-submit's ``--master`` (the job never replaces
            it): ``local[*]`` (default), ``local[N]``, ``spark://host:7077``, ``yarn``,
            ``k8s://https://host:443``.
        trim: trim the stream up to the checkpoint after a committed export.
        ranges: id ranges the stream is split into (default: 4 per core, fewer for short streams).
        page_size: entries per XRANGE call (default 5000).
        aggregates: recompute aggregates, summary table and chart.
        mirror: copy the checkpoint into Redis (``{prefix}:history:export``).
        top_causes: causes kept per day, queue and task (default 5).
        summary_rows: rows of the summary table (default 20).
        chart_days: days of history in the chart (default 7).
        quiet: no progress lines and no summary table on the job's output.
        result_json: local file the job writes its result to.
        conf: extra ``--conf`` Spark settings (``spark.executor.memory``...).
        spark_submit: spark-submit binary (see :func:`find_spark_submit`).
        job: the job's entry file (see :func:`find_job`).
        workdir: where the job's zip and entry script are written (see :func:`package_job`).

    Raises:
        ExportError: neither ``redis_url`` nor ``snapshot``, ``trim`` with ``snapshot``, an
            empty ``master``, or the job or spark-submit cannot be found.
    """
    if snapshot is None and not redis_url:
        raise ExportError("export needs redis_url (dlx_redis_url) or snapshot (a JSON-lines file)")
    if not master or master != master.strip():
        raise ExportError(
            f"master must name a Spark master (local[*], local[N], spark://host:port, yarn, "
            f"k8s://https://host:port), got {master!r}"
        )
    if snapshot is not None and trim:
        raise ExportError("trim applies to the Redis stream; it cannot go with snapshot")
    entry, archive = find_job(job, workdir)
    command = [find_spark_submit(spark_submit), "--master", master, "--name", "celery-dlx-export"]
    settings = {"spark.ui.showConsoleProgress": "false"}
    if master.startswith("local"):
        # a local run talks to itself only: keep the driver on loopback
        settings.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    settings.update(conf or {})
    for name, value in settings.items():
        command.extend(["--conf", f"{name}={value}"])
    command.extend(["--py-files", str(archive), str(entry)])
    options: dict[str, Any] = {
        "out": os.fspath(out),
        "redis_url": redis_url if snapshot is None else None,
        "prefix": key_prefix,
        "snapshot": None if snapshot is None else os.fspath(snapshot),
        "ranges": ranges,
        "page_size": page_size,
        "trim": trim,
        "no_mirror": not mirror,
        "no_aggregates": not aggregates,
        "top_causes": top_causes,
        "summary_rows": summary_rows,
        "chart_days": chart_days,
        "result_json": None if result_json is None else os.fspath(result_json),
        "quiet": quiet,
    }
    return command + _job_args(options)


def _pump(source: IO[str], sink: IO[str] | None, tail: collections.deque[str]) -> None:
    for line in source:
        tail.append(line.rstrip("\n"))
        if sink is not None:
            sink.write(line)
            sink.flush()


def _run(
    command: list[str], env: Mapping[str, str], echo: bool, timeout: float | None
) -> tuple[int, list[str]]:
    tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL)
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env=dict(env),
        start_new_session=True,
    )
    assert process.stdout is not None and process.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(source, sink if echo else None, tail), daemon=True)
        for source, sink in ((process.stdout, sys.stdout), (process.stderr, sys.stderr))
    ]
    for pump in pumps:
        pump.start()
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()
        raise ExportError(
            f"export did not finish within {timeout}s (timeout=); it was killed"
        ) from None
    for pump in pumps:
        pump.join(timeout=10)
    return code, list(tail)


def run_export(
    app: Celery | None = None,
    *,
    out: str | os.PathLike[str],
    redis_url: str | None = None,
    key_prefix: str | None = None,
    snapshot: str | os.PathLike[str] | None = None,
    master: str = "local[*]",
    trim: bool = False,
    echo: bool = True,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    **options: Unpack[SparkOptions],
) -> ExportResult:
    """Run one export with spark-submit and return what it did.

    Args:
        app: a Celery app whose ``dlx_redis_url`` and ``dlx_key_prefix`` are used when
            ``redis_url``/``key_prefix`` are not given (not needed with ``snapshot``).
        out, redis_url, key_prefix, snapshot, master, trim, options: see
            :func:`build_spark_submit_command`.
        echo: show the job's progress and summary on this process's stdout/stderr.
        timeout: seconds before the job is killed (None: no limit).
        env: environment of the job (default: this process's, with ``PYSPARK_PYTHON`` set to
            this interpreter so local executors have redis-py).

    Raises:
        ExportError: bad options, the job failed (its error or the tail of its output is in the
            message), or it timed out.
    """
    if app is not None and snapshot is None and (redis_url is None or key_prefix is None):
        app_url, app_prefix = export_settings(app)
        redis_url = redis_url or app_url
        key_prefix = key_prefix or app_prefix
    elif app is not None and key_prefix is None:
        key_prefix = export_settings(app)[1]
    with tempfile.TemporaryDirectory(prefix="dlx-export-") as scratch:
        result_path = Path(scratch) / "result.json"
        job_options: SparkOptions = {**options, "workdir": options.get("workdir") or scratch}
        command = build_spark_submit_command(
            out=out,
            redis_url=redis_url,
            key_prefix=key_prefix,
            snapshot=snapshot,
            master=master,
            trim=trim,
            result_json=result_path,
            **job_options,
        )
        job_env = dict(os.environ if env is None else env)
        job_env.setdefault("PYSPARK_PYTHON", sys.executable)
        job_env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        if master.startswith("local"):
            job_env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        code, tail = _run(command, job_env, echo, timeout)
        data = json.loads(result_path.read_text("utf-8")) if result_path.exists() else None
    if data is None:
        output = "\n".join(tail)
        raise ExportError(f"spark-submit exited with {code} and no result:\n{output}")
    if data.get("status") == "failed":
        raise ExportError(f"export failed: {data.get('error')}")
    return ExportResult.from_dict(data, command)


class HistoryDump(Protocol):
    """What :func:`dump_snapshot` needs of the history role (``runtime.history``)."""

    def dump(self, path: str, *, after: str | None = None, page: int = 10000) -> int: ...


def dump_snapshot(
    history: HistoryDump,
    path: str | os.PathLike[str],
    *,
    after: str | None = None,
    page: int = 10000,
) -> int:
    """Write the history stream (entries after ``after``, or all) to a JSON-lines snapshot the
    exporter reads with ``snapshot=``: one object per line, ``id`` plus the entry's fields;
    ``history`` is the app's history role (``get_runtime(app).history``). Returns how many
    entries were written."""
    return history.dump(os.fspath(path), after=after, page=page)
