"""Edit a buried message's payload or headers, see the diff, and replay the edited copy.

A package of its own beside ``celery_dlx`` (as the console is): it stands on celery_dlx's public
API (the package root, its errors, :mod:`celery_dlx.ops` and the payload codecs), and a worker
never loads it. :mod:`celery_dlx_edit.payload` edits a decoded payload (pure);
:mod:`celery_dlx_edit.edit` plans the edited copy of an obituary and replays it. The command line
(``celery -A proj dlx edit``) and the console front it.
"""
