"""Where the documentation is published: messages name a page by its URL, not by a file.

The wheel ships no ``docs/``, so an error that says "see docs/migration.md" points a user at a file
they do not have. :func:`doc_url` builds the page's address on the documentation site (the
``Documentation`` URL of ``project_urls`` in setup.cfg, checked equal by a test).
"""

from __future__ import annotations

import re

#: The published documentation site (Sphinx's html builder: one ``PAGE.html`` per docs/PAGE.md).
DOCS_URL = "https://celery-dlx.readthedocs.io/en/latest/"

_PAGE = re.compile(r"[a-z0-9-]+")


def doc_url(page: str, anchor: str = "") -> str:
    """The URL of a documentation page, named as its file in docs/ without ``.md``.

    Args:
        page: the page's name, e.g. ``"migration"`` for docs/migration.md.
        anchor: a heading's anchor on that page (``"the-orphan-queue-alert"``), or empty.

    Raises:
        ValueError: ``page`` is not a plain page name (a path, an extension, upper case).
    """
    if not _PAGE.fullmatch(page):
        raise ValueError(f"doc_url takes a page name such as 'migration', got {page!r}")
    return f"{DOCS_URL}{page}.html" + (f"#{anchor}" if anchor else "")
