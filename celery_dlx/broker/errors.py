"""The broker errors every celery_dlx process treats alike: when one escapes a publish or a
consume, the publisher is rebuilt and the work retried later; anything else is a bug, not an
outage."""

from __future__ import annotations

from amqp.exceptions import AMQPError
from kombu.exceptions import OperationalError

from celery_dlx.errors import PublishError

#: The broker connection, channel or socket failed (``ConnectionError`` is an ``OSError``), or
#: the broker did not confirm a publish (:class:`~celery_dlx.errors.PublishError`).
BROKER_ERRORS: tuple[type[Exception], ...] = (PublishError, OperationalError, AMQPError, OSError)

#: What a connection attempt raises when the broker cannot be reached.
UNREACHABLE: tuple[type[Exception], ...] = (OperationalError, ConnectionError)
