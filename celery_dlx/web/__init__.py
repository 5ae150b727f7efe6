"""``celery dlx web``: a console for the graveyard, parked retries and fate rates.

A layer beside :mod:`celery_dlx.cli`: it reads through :mod:`celery_dlx.ops` and the runtime's
roles, acts through :func:`celery_dlx.ops.canary.replay_run` and :func:`celery_dlx.ops.purge.purge`,
imports only the public API (an import contract says so), and nothing but the ``dlx web`` command
imports it. Starlette + Jinja2 on uvicorn, every asset in the
package (no CDN), pages readable without JavaScript.
"""
