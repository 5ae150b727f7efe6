"""Where the documentation is published: messages name a page by its URL, not by a file (the
wheel ships no ``docs/``). The site is setup.cfg's ``Documentation`` URL (checked by a test)."""

from __future__ import annotations

import re

#: The published documentation site (Sphinx's html builder: one ``PAGE.html`` per docs/PAGE.md).
DOCS_URL = "https://celery-dlx.readthedocs.io/en/latest/"

_PAGE = re.compile(r"[a-z0-9-]+")


def doc_url(page: str, anchor: str = "") -> str:
    """The URL of documentation ``page`` (its file in docs/ without ``.md``: ``"migration"``),
    at heading ``anchor`` if given.

    Raises:
        ValueError: ``page`` is not a plain page name (a path, an extension, upper case).
    """
    if not _PAGE.fullmatch(page):
        raise ValueError(f"doc_url takes a page name such as 'migration', got {page!r}")
    return f"{DOCS_URL}{page}.html" + (f"#{anchor}" if anchor else "")
