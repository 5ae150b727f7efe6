"""What became of a buried message after it was replayed: the obituary's status names (kept by
:mod:`celery_dlx.store.status`)."""

from __future__ import annotations

import json
from typing import Any

#: An obituary nobody replayed (or replayed and failed again: its new obituary).
UNRESOLVED = "unresolved"
#: Replayed, waiting for the outcome.
REPLAYED = "replayed"
#: The replayed copy ran (or was not dead-lettered again within ``dlx_resolve_after``).
RESOLVED = "resolved"
#: The replayed copy was buried again: ``next`` names the new obituary.
FAILED_AGAIN = "failed-again"
#: Every status, in the order of an obituary's life.
STATUSES = (UNRESOLVED, REPLAYED, RESOLVED, FAILED_AGAIN)
#: The statuses counted in a cause's group hash (``n_<status>``).
COUNTED = (REPLAYED, RESOLVED, FAILED_AGAIN)


def parse(raw: Any) -> dict[str, Any]:
    """A stored status document (``{}`` for none or an unreadable one)."""
    try:
        doc = json.loads(raw)
    except (TypeError, ValueError):  # TypeError: None
        return {}
    return doc if isinstance(doc, dict) else {}


def status_of(doc: dict[str, Any]) -> str:
    return str(doc.get("s") or UNRESOLVED)
