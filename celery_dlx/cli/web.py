"""``celery -A proj dlx web``: serve the console (registered by :mod:`celery_dlx.cli.main`).

The console is a package of its own, :mod:`celery_dlx_console`, whose dependencies are the ``web``
extra: its options are declared here, so ``dlx --help`` lists them without it, and the command
imports it only when it runs.
"""

from __future__ import annotations

from typing import Any

import click

from celery_dlx.cli.main import app_of
from celery_dlx.errors import DLXError


@click.command("web")
@click.option(
    "--host", default=None, help="Address to listen on (default: dlx_web_host, 127.0.0.1)."
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port (default: dlx_web_port, 5566).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="A host name the console also answers (a proxy's or tunnel's; '*.corp.example' for "
    "a domain's names); repeatable (default: dlx_web_allowed_hosts).",
)
@click.option(
    "--basic-auth",
    "operators",
    multiple=True,
    metavar="USER:PASSWORD",
    help="An operator (read, replay, purge); repeatable (default: dlx_web_basic_auth).",
)
@click.option(
    "--viewer-auth",
    "viewers",
    multiple=True,
    metavar="USER:PASSWORD",
    help="A viewer (read only); repeatable (default: dlx_web_viewer_auth).",
)
@click.option(
    "--editor-auth",
    "editors",
    multiple=True,
    metavar="USER:PASSWORD",
    help="An editor (an operator who may also edit a message before replaying it); "
    "repeatable (default: dlx_web_editors).",
)
@click.option(
    "--proto",
    "protos",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Extra protobuf descriptor set to decode payloads with (repeatable).",
)
@click.option("-l", "--loglevel", default="INFO", show_default=True, help="Logging level.")
@click.pass_context
def web_command(ctx: click.Context, /, loglevel: str, **options: Any) -> None:
    """Serve the web console: causes, obituaries, parked retries, replay and purge, /metrics.

    Without --basic-auth/--viewer-auth it is open to anyone who can reach it, so it then
    listens only on a loopback address.
    """
    try:
        from celery_dlx_console.command import serve_console
    except ImportError as exc:
        raise click.ClickException(
            f"the console needs the web extra: pip install 'celery-dlx[web]' ({exc})"
        ) from exc
    try:
        serve_console(app_of(ctx), loglevel, options)
    except DLXError as exc:
        raise click.ClickException(str(exc)) from exc
