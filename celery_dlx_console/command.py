"""What ``celery -A proj dlx web`` runs (the command itself is :mod:`celery_dlx.cli.web`)."""

from __future__ import annotations

import logging
from typing import Any

import click
from celery import Celery

from celery_dlx import get_runtime
from celery_dlx_console.auth import Accounts, check_listen
from celery_dlx_console.console import WebSettings
from celery_dlx_console.server import serve


def serve_console(app: Celery, loglevel: str, options: dict[str, Any]) -> None:
    """Serve the console of ``app`` until SIGINT/SIGTERM, with the command's ``options``.

    Raises:
        ConfigurationError: a non-loopback address without credentials, bad accounts or hosts.
    """
    runtime = get_runtime(app)
    settings = WebSettings.from_config(runtime.config, **options)
    logging.basicConfig(
        level=loglevel.upper(), format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s"
    )
    accounts = Accounts.from_lists(settings.operators, settings.viewers, settings.editors)
    check_listen(settings.host, accounts)  # before the banner: a refused one never ran
    ops, eds, views = len(settings.operators), len(settings.editors), len(settings.viewers)
    who = f"{ops} operator(s), {eds} editor(s), {views} viewer(s)"
    who = "open (loopback only)" if accounts.open else who
    shown = f"[{settings.host}]" if ":" in settings.host else settings.host
    click.echo(f"celery_dlx console on http://{shown}:{settings.port}/ ({who})", err=True)
    serve(runtime, settings, log_level=loglevel)
