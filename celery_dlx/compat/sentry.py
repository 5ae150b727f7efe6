"""sentry-sdk internals celery_dlx relies on (checked on sentry-sdk 2.75.0, installed here; 2.0.1,
the lowest stack's in ``tests/constraints/lowest.txt``, is run by the matrix).

Canary: ``tests/unit/test_compat.py`` (sentry-sdk section).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sentry_sdk.types import Event, Hint


def add_sentry_event_processor_once(processor: Callable[[Event, Hint], Event | None]) -> None:
    """Add ``processor`` to sentry-sdk's global event processors unless it is there already.

    Internal: ``sentry_sdk.scope.global_event_processors``; the public
    ``add_global_event_processor`` appends unconditionally, and installing celery_dlx into
    several apps of one process must not run the processor several times per event.
    """
    from sentry_sdk import scope

    if processor not in scope.global_event_processors:
        scope.add_global_event_processor(processor)
