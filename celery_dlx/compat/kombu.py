"""kombu internals celery_dlx relies on (checked on kombu 5.7.0, installed here, and 5.3.0, the
lowest stack's in ``tests/constraints/lowest.txt``, by reading its sources).

Canaries: ``tests/unit/test_compat.py`` (kombu section) and ``tests/unit/test_compat_canaries.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kombu import Queue

#: ``(name, type)`` pairs of kombu ``Object.attrs``: the attributes a copy keeps (kombu's type).
QueueAttrs = tuple[tuple[str, Any], ...]
#: The type of one such attribute: a converter its value goes through, or None to keep it as is.
AttrType = Callable[[object], object] | None


def queue_attrs(*extra: tuple[str, AttrType]) -> QueueAttrs:
    """kombu ``Queue.attrs`` followed by ``extra``, for a ``Queue`` subclass with more fields.

    Internal: kombu copies a queue on every bind (``Object.__copy__`` rebuilds it from
    ``as_dict()``, which lists ``attrs``); a subclass attribute not in ``attrs`` is lost by the
    copy the worker declares.
    """
    return (*Queue.attrs, *extra)


def consumer_tags(consumer: object) -> Mapping[str, str]:
    """Queue name to consumer tag of a kombu ``Consumer`` (empty when it consumes nothing).

    Internal: ``kombu.Consumer._active_tags``. AMQP deliveries name their consumer tag, not their
    queue, and kombu keeps the tag it chose per queue only there.
    """
    tags = getattr(consumer, "_active_tags", None)
    return {str(queue): str(tag) for queue, tag in tags.items()} if tags else {}


def serializer_name(content_type: str) -> str | None:
    """kombu's serializer name (``json``, ``pickle``...) for ``content_type``, if registered.

    Internal: ``kombu.serialization.registry.type_to_name``; kombu's public ``dumps`` takes a
    serializer name, and nothing public maps a message's content type back to it.
    """
    from kombu import serialization

    # celery-types omits the module-level `registry` (it is not in kombu's __all__).
    registry = serialization.registry  # type: ignore[attr-defined]
    name = registry.type_to_name.get(content_type)
    return None if name is None else str(name)


def hub_wakes_for_other_threads() -> bool:
    """True when kombu's ``Hub.call_soon``, called from another thread than the loop's, makes
    the loop's poll return (so an ack a thread asks for is written at once).

    Feature detection (kombu 5.3.0, 5.3.4 and 5.6.2 checked: no; 5.7.0: yes): kombu 5.7 gave its
    ``Hub`` a socket pair written by ``call_soon`` from other threads (``Hub._create_waker``, a
    private name: no public attribute says so). Before, such a callback waited for the loop's
    next event or timer, up to ten seconds.
    """
    from kombu.asynchronous.hub import Hub

    return hasattr(Hub, "_create_waker")
