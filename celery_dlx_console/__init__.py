"""``celery dlx web``: a console for the graveyard, parked retries and fate rates.

A layer beside :mod:`celery_dlx.cli` that reads and acts through :mod:`celery_dlx.ops`; only the
``dlx web`` command imports it. Starlette + Jinja2 on uvicorn, every asset in the package (no
CDN), pages readable without JavaScript.
"""
