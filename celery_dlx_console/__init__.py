"""``celery dlx web``: a console for the graveyard, parked retries and fate rates.

A package beside :mod:`celery_dlx`, in the same distribution, whose dependencies are the ``web``
extra (as Flower is beside Celery): it reads and acts through celery_dlx's public API, the package
root, :mod:`celery_dlx.errors`, :mod:`celery_dlx.ops` and the payload codecs (a contract in
``pyproject.toml`` says so); only the ``dlx web`` command (:mod:`celery_dlx.cli.web`) imports it.
Starlette + Jinja2 on uvicorn, every asset in the package (no CDN), pages readable without
JavaScript.
"""
