"""``celery dlx parked/stats/export``: what waits, how much fails, and the failure history out.

Thin: :mod:`celery_dlx.ops.inspection` and :mod:`celery_dlx_spark.launch` do the work and return
data (``check`` and ``migrate`` are in :mod:`celery_dlx.cli.broker`).
"""

from __future__ import annotations

import click

from celery_dlx.cli.kit import (
    EXIT_NOT_FOUND,
    command,
    duration,
    echo_json,
    handle_errors,
    json_option,
    limit_option,
    runtime_of,
)
from celery_dlx.cli.main import app_of
from celery_dlx.fates import now_ms
from celery_dlx.ops.render import ago, count, human_seconds, table


@command("parked")
@limit_option("Most parked retries to show, soonest due first.")
@click.option(
    "--purge",
    "purge_ids",
    multiple=True,
    metavar="ENTRY_ID",
    help="Delete this parked retry (its entry_id, MESSAGE_ID:ATTEMPT); repeatable.",
)
@click.option(
    "--retry-now",
    "retry_now",
    is_flag=True,
    help="Make the retries named by --id or --cause due now: drained at the next tick.",
)
@click.option(
    "--bury-now",
    "bury_now",
    is_flag=True,
    help="Bury the retries named by --id or --cause now: an obituary each, 'buried by USER'.",
)
@click.option(
    "--id",
    "entry_ids",
    multiple=True,
    metavar="ENTRY_ID",
    help="With --retry-now or --bury-now: a parked retry (MESSAGE_ID:ATTEMPT); repeatable.",
)
@click.option(
    "--cause",
    metavar="CAUSE",
    help="With --retry-now or --bury-now: every parked retry of this cause fingerprint.",
)
@click.option(
    "--dry-run", is_flag=True, help="With --retry-now or --bury-now: say what would be done."
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
def parked_command(
    ctx: click.Context,
    limit: int,
    purge_ids: tuple[str, ...],
    retry_now: bool,
    bury_now: bool,
    entry_ids: tuple[str, ...],
    cause: str | None,
    dry_run: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Parked retries, soonest due first (and the TTL ladder's queues with dlx_delay_backend=ttl).

    With --purge, deletes the named retries instead (recorded in the history as purged). With
    --retry-now or --bury-now, acts on the retries named by --id or --cause, one by one; a retry
    a drain is publishing at that moment is left to it (reported as claimed). Each action is
    audited (the failure history and the console's audit log).
    """
    from celery_dlx.ops.inspection import parked_data, purge_parked

    if retry_now or bury_now:
        _act_on_parked(ctx, "bury-now" if bury_now else "retry-now", entry_ids, cause, dry_run, yes)
        return
    if entry_ids or cause or dry_run:
        raise click.UsageError("--id, --cause and --dry-run go with --retry-now or --bury-now")
    if purge_ids:
        if not yes:
            click.confirm(f"Purge {len(purge_ids)} parked retries?", abort=True, err=True)
        report = purge_parked(runtime_of(ctx), purge_ids)
        if as_json:
            echo_json(report)
        else:
            click.echo(f"{len(report['purged'])} purged, {len(report['missing'])} not found")
        if report["missing"]:
            ctx.exit(EXIT_NOT_FOUND)
        return

    data = parked_data(runtime_of(ctx), limit=limit)
    if as_json:
        echo_json(data)
        return
    now = now_ms()
    rows = [
        (
            m["due_at"],
            ago(m["due_ms"], now) + (" (claimed)" if m["claimed"] else ""),
            m["queue"],
            m["task"] or "-",
            m["attempt"],
            m["message_id"],
            m["cause"] or "-",
        )
        for m in data["messages"]
    ]
    headers = ("DUE", "WHEN", "QUEUE", "TASK", "ATT", "MESSAGE", "CAUSE")
    if rows:
        click.echo(table(headers, rows, shrink=("TASK", "MESSAGE", "QUEUE")))
    click.echo(
        f"{data['count']} parked ({data['due_now']} due now), {len(rows)} shown; "
        f"backend {data['backend']}"
    )
    if data["ladder"] is not None:
        ladder = [
            (r["delay_queue"], r["queue"], human_seconds(r["delay_seconds"]), r["messages"])
            for r in data["ladder"]
        ]
        click.echo(f"\nTTL ladder: {sum(r['messages'] for r in data['ladder'])} waiting")
        if ladder:
            click.echo(table(("DELAY QUEUE", "RETURNS TO", "DELAY", "WAITING"), ladder))


def _act_on_parked(
    ctx: click.Context,
    action: str,
    entry_ids: tuple[str, ...],
    cause: str | None,
    dry_run: bool,
    yes: bool,
) -> None:
    import getpass

    from celery_dlx.ops import parked_actions

    if ctx.params.get("retry_now") and ctx.params.get("bury_now"):
        raise click.UsageError("--retry-now or --bury-now, not both")
    if bool(entry_ids) == (cause is not None):
        raise click.UsageError(f"--{action} needs --id ENTRY_ID (repeatable) or --cause CAUSE")
    what = f"cause {cause}" if cause else count(len(entry_ids), "parked retry", "parked retries")
    if not (yes or dry_run):
        click.confirm(f"{action} {what}?", abort=True, err=True)
    act = parked_actions.bury_now if action == "bury-now" else parked_actions.retry_now
    report = act(
        runtime_of(ctx),
        list(entry_ids) or None,
        cause=cause,
        by=f"cli:{getpass.getuser()}",
        dry_run=dry_run,
    )
    if ctx.params.get("as_json"):
        echo_json(report.as_dict())
    else:
        verb = f"would {action}" if dry_run else action
        click.echo(
            f"{verb}: {len(report.done)} done, {len(report.claimed)} claimed by a drain, "
            f"{len(report.missing)} not found"
        )
        for oid in report.obituaries:
            click.echo(f"buried as {oid}")
    if report.missing:
        ctx.exit(EXIT_NOT_FOUND)


@command("stats")
@click.option(
    "--window",
    default="1h",
    callback=duration("--window"),
    show_default=True,
    help="Count fate changes over this long (up to 8d).",
)
@json_option
def stats_command(ctx: click.Context, window: float, as_json: bool) -> None:
    """Fate changes per queue and fate, the graveyard (oldest dead) and the parking store."""
    from celery_dlx.ops.inspection import stats_data

    data = stats_data(runtime_of(ctx), window_s=window)
    if as_json:
        echo_json(data)
        return
    fates = sorted({f for per in data["fates"].values() for f in per})
    rows = [[q, *[per.get(f, 0) for f in fates]] for q, per in data["fates"].items()]
    click.echo(f"fate changes over the last {human_seconds(window)}:")
    click.echo(table(("QUEUE", *[f.upper() for f in fates]), rows) if rows else "  none")
    now = now_ms()
    g = data["graveyard"]
    oldest = f", oldest buried {ago(g['oldest_ms'], now)}" if g["oldest_ms"] else ""
    click.echo(f"\ngraveyard: {count(g['count'], 'obituary', 'obituaries')}{oldest}")
    if g["queues"]:
        qrows = [
            (q["queue"], q["count"], ago(q["oldest_ms"], now), ago(q["last_ms"], now))
            for q in g["queues"]
        ]
        click.echo(table(("QUEUE", "DEAD", "OLDEST", "LAST"), qrows))
    p = data["parked"]
    nxt = f", next due {ago(p['next_due_ms'], now)}" if p["next_due_ms"] else ""
    click.echo(f"\nparked: {p['count']} ({p['due_now']} due now{nxt})")
    click.echo(f"history: {count(data['history_length'], 'entry', 'entries')}")
    for bad in data["malformed_counters"]:
        click.echo(f"unreadable counter {bad['key']} {bad['field']}: {bad['reason']}", err=True)


@click.command("export")
@click.option("--out", required=True, help="Output directory (local path, hdfs://, s3a://...).")
@click.option(
    "--master",
    default="local[*]",
    show_default=True,
    help="Spark master, given to spark-submit: local[N], spark://HOST:PORT, yarn, k8s://URL.",
)
@click.option(
    "--conf",
    "conf_items",
    multiple=True,
    metavar="KEY=VALUE",
    help="A Spark setting for spark-submit (spark.executor.memory=2g...); repeatable.",
)
@click.option(
    "--trim", is_flag=True, help="Trim the history stream up to the checkpoint after the export."
)
@click.option(
    "--snapshot",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="Read a JSON-lines snapshot instead of Redis.",
)
@click.option(
    "--timeout", default=None, callback=duration("--timeout"), help="Kill the job after this long."
)
@click.option("--print-command", is_flag=True, help="Print the spark-submit command and exit.")
@json_option
@click.pass_context
@handle_errors
def export_command(
    ctx: click.Context,
    out: str,
    master: str,
    conf_items: tuple[str, ...],
    trim: bool,
    snapshot: str | None,
    timeout: float | None,
    print_command: bool,
    as_json: bool,
) -> None:
    """Export the failure history to Parquet with the Spark job (spark-submit)."""
    import shlex

    from celery_dlx_spark.launch import build_spark_submit_command, export_settings, run_export

    if trim and snapshot:
        raise click.UsageError("--trim applies to the Redis stream; it cannot go with --snapshot")
    if any("=" not in item or item.startswith("=") for item in conf_items):
        raise click.UsageError("--conf takes KEY=VALUE (a Spark setting)")
    conf = dict(item.split("=", 1) for item in conf_items)
    app = app_of(ctx)
    if print_command:
        redis_url, prefix = export_settings(app)
        command = build_spark_submit_command(
            out=out,
            redis_url=None if snapshot else redis_url,
            key_prefix=prefix,
            snapshot=snapshot,
            master=master,
            trim=trim,
            conf=conf,
        )
        if as_json:
            echo_json(command)
        else:
            click.echo(shlex.join(command))
        return
    result = run_export(
        app,
        out=out,
        master=master,
        conf=conf,
        trim=trim,
        snapshot=snapshot,
        timeout=timeout,
        echo=not as_json,
    )
    if as_json:
        echo_json({k: v for k, v in result.__dict__.items() if k != "raw"})
        return
    click.echo(
        f"{result.status}: {result.records} records, {result.malformed} malformed, to {result.out}"
        + (f"; chart {result.chart}" if result.chart else "")
        + (f"; Spark application {result.app_id} on {result.master}" if result.app_id else "")
    )


@command("migrate-keys")
@click.option("--dry-run", is_flag=True, help="Count what would move, per queue; change nothing.")
@json_option
def migrate_keys_command(ctx: click.Context, dry_run: bool, as_json: bool) -> None:
    """Move parked retries and obituaries from the single-tag Redis layout to keys per queue.

    For dlx_redis_shards = "queue" (or "auto" on a ?cluster=true URL): copies each retry
    parked under {prefix}:parked:* and each obituary under {prefix}:graveyard:* to its queue's
    keys, then deletes the original. Safe to run while workers run and to run again after an
    interruption (nothing is lost). The failure history keeps its single-tag key.
    """
    runtime = runtime_of(ctx)
    done, graves = runtime.migrate_keys(dry_run=dry_run)
    if as_json:
        parked = {k: v for k, v in done.__dict__.items() if k != "gone"}  # a park is never gone
        echo_json({"dry_run": dry_run, **parked, "graveyard": graves.__dict__})
        return

    def obits(n: int) -> str:
        return count(n, "obituary", "obituaries")

    for report, per_queue, found, noun in (
        (done, str, f"{done.found} parked retries", "parked retries"),
        (graves, obits, obits(graves.found), "obituaries"),
    ):
        for queue, n in sorted(report.queues.items()):
            click.echo(f"{queue}: {per_queue(n)}")
        if dry_run:
            click.echo(f"{found} would move ({report.left} unreadable, left)")
        else:
            click.echo(
                f"{report.moved} of {report.found} {noun} moved ({report.copied} copied now, "
                f"{report.present} copied by an earlier run); {report.left} left in place"
            )


@command("overflow")
@click.option(
    "--requeue",
    is_flag=True,
    help="Hand the waiting dead letters back to the DLX service (do it once their cause has "
    "room: after a purge or a replay).",
)
@json_option
def overflow_command(ctx: click.Context, requeue: bool, as_json: bool) -> None:
    """Dead letters waiting in the overflow queue: their cause held dlx_graveyard_max_per_cause
    obituaries when they died. Nothing there is dropped."""
    from celery_dlx.ops.overflow import overflow

    data = overflow(runtime_of(ctx), requeue=requeue)
    if as_json:
        echo_json(data)
        return
    if requeue:
        click.echo(f"{count(data['requeued'], 'dead letter')} handed back to the DLX service")
    click.echo(
        f"{count(data['waiting'], 'dead letter')} waiting in {data['queue']} "
        f"(dlx_graveyard_max_per_cause = {data['max_per_cause']})"
    )


#: The commands this module adds to the ``dlx`` group.
COMMANDS = (parked_command, stats_command, export_command, migrate_keys_command, overflow_command)
