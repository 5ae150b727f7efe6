"""``celery dlx breakers``: the open per-cause breakers (``dlx_breaker``), and closing one.

Thin: :mod:`celery_dlx.ops.breakers` does the work and returns data.
"""

from __future__ import annotations

import click

from celery_dlx.cli.kit import EXIT_NOT_FOUND, echo_json, handle_errors, json_option, runtime_of
from celery_dlx.fates import now_ms
from celery_dlx.ops.render import ago, table


@click.group("breakers", invoke_without_command=True)
@json_option
@click.pass_context
@handle_errors
def breakers_command(ctx: click.Context, as_json: bool) -> None:
    """List the open per-cause breakers: what each holds and when its next canary runs."""
    if ctx.invoked_subcommand is not None:
        return
    from celery_dlx.ops.breakers import open_breakers

    rows = open_breakers(runtime_of(ctx))
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("no open breakers")
        return
    now = now_ms()
    click.echo(
        table(
            ("QUEUE", "CAUSE", "TASK", "EXCEPTION", "OPENED", "HELD", "NEXT CANARY"),
            [
                (
                    b["queue"],
                    b["cause"],
                    b["task"] or "-",
                    b["exc_type"] or "-",
                    ago(b["opened_ms"], now),
                    b["held"],
                    ago(b["probe_ms"], now),
                )
                for b in rows
            ],
        )
    )


@breakers_command.command("close")
@click.argument("cause")
@click.option("--queue", default=None, help="Close it on this queue only (default: every queue).")
@json_option
@click.pass_context
@handle_errors
def close_command(ctx: click.Context, cause: str, queue: str | None, as_json: bool) -> None:
    """Close the breaker of CAUSE and release the messages it held at its release_rate
    (exit 3 when no such breaker is open)."""
    from celery_dlx.ops.breakers import close_breakers

    closed = close_breakers(runtime_of(ctx), cause, queue)
    if as_json:
        echo_json(closed)
    else:
        for c in closed:
            click.echo(
                f"closed {c['cause']} on {c['queue']}: {c['released']} held messages released"
            )
        if not closed:
            click.echo(f"no open breaker for cause {cause}", err=True)
    if not closed:
        ctx.exit(EXIT_NOT_FOUND)


COMMANDS = [breakers_command]
