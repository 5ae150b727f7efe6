"""Worker consumer that keeps messages Celery would drop or dead-letter blindly.

Celery acks a body it cannot decode (lost) and rejects unknown or invalid task messages (a
malformed ``x-death`` then crashes a RabbitMQ 3.10 queue). Under ``dlx_enabled`` they are buried
by publishing a clean copy with the reason to the dead-letter exchange, then acked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.utils.objects import Bunch

from celery_dlx.broker.frames import tolerant
from celery_dlx.compat.celery import ConsumerHooks, divert_reject
from celery_dlx.errors import MalformedHeader
from celery_dlx.message.headers import DLXState, clean_headers, dead_letter_refusal, read_state
from celery_dlx.message.names import (
    DELIVERY_QUEUE_HEADER,
    QUEUE_HEADER,
    RAW_PROPERTIES_PROPERTY,
    REASON_HEADER,
    UNDECODABLE_PROPERTY,
)
from celery_dlx.message.outgoing import Outgoing, copy_properties
from celery_dlx.wiring.runtime import get_runtime
from celery_dlx.worker.strategy import Message, _queue_of

logger = logging.getLogger(__name__)


class DLXConsumer(ConsumerHooks):
    """Celery's consumer with undecodable, unknown and invalid messages buried, not dropped."""

    def dlx_read_connection(self, connection: Any) -> Any:
        # A header py-amqp raises on (a 1969 timestamp, a name not UTF-8) would stop the worker;
        # celery_dlx's reader also keeps each header's field type for copies.
        return tolerant(connection)

    def dlx_task_handler(self, handler: Callable[..., object]) -> Callable[..., object]:
        def on_task_received(message: Message) -> Any:
            problem = (message.properties or {}).get(UNDECODABLE_PROPERTY)
            if problem is None:
                return handler(message)
            if self._bury_raw(message, f"undecodable: AMQP properties: {problem}"):
                message.ack()
            else:
                message.requeue()  # the graveyard could not take it: never dead-lettered blindly
            return None

        return on_task_received

    def _bury_raw(self, message: Message, reason: str) -> bool:
        """Publish a clean copy of ``message`` to the dead-letter exchange; True if confirmed."""
        info = message.delivery_info or {}
        queue = str(
            _queue_of(self, message) or info.get("routing_key") or self.app.conf.task_default_queue
        )
        runtime = get_runtime(self.app)
        headers = dict(message.headers or {})
        headers.pop(DELIVERY_QUEUE_HEADER, None)
        raw_properties = (message.properties or {}).get(RAW_PROPERTIES_PROPERTY)
        if raw_properties is not None:
            headers[RAW_PROPERTIES_PROPERTY] = raw_properties  # a byte array on the wire
        try:
            state = read_state(headers)
        except MalformedHeader:
            state = DLXState()
        copy = Outgoing(
            body=message.body if isinstance(message.body, bytes) else str(message.body).encode(),
            routing_key=queue,
            exchange=runtime.config.exchange,
            headers={
                **clean_headers(headers, DLXState(attempt=state.attempt, queue=queue)),
                REASON_HEADER: reason[:1000],
                QUEUE_HEADER: queue,
            },
            properties={
                **copy_properties(message.properties),
                "content_type": message.content_type,
                "content_encoding": message.content_encoding,
            },
        )
        try:
            runtime.publisher.publish(copy)
        except Exception as err:
            logger.warning("could not bury an undecodable message from %s (%r)", queue, err)
            runtime.reset_publisher()
            return False
        # The DLX service logs (and alerts on) the burial itself, once, with the obituary.
        logger.warning(
            "quarantined a message from %s: %s: sent to the graveyard", queue, reason[:300]
        )
        return True

    def _divert(self, message: Message, reason: str) -> None:
        """Make Celery's coming reject of ``message`` an ack (buried) or a requeue (never DLX)."""
        if self._bury_raw(message, reason):
            divert_reject(
                message, lambda log, errors, requeue=False: message.ack_log_error(log, errors)
            )
        elif dead_letter_refusal(message.headers):
            divert_reject(message, lambda log, errors, requeue=False: message.requeue())

    def _mark_failed(self, message: Message, exc: Exception) -> None:
        """Record FAILURE for a task message that can never run."""
        headers = message.headers if isinstance(message.headers, dict) else {}
        task_id = headers.get("id")
        if not task_id or not self.app.conf.result_backend:
            return
        request = Bunch(
            name=headers.get("task"),
            chord=None,
            root_id=headers.get("root_id"),
            correlation_id=(message.properties or {}).get("correlation_id"),
            reply_to=(message.properties or {}).get("reply_to"),
            errbacks=None,
        )
        try:
            self.app.backend.mark_as_failure(task_id, exc, request=request)
        except Exception:  # a result backend outage must not stop the consumer
            logger.warning("could not store FAILURE for %s", task_id, exc_info=True)

    def dlx_decode_error(self, message: Message, exc: Exception) -> None:
        if self._bury_raw(message, f"undecodable: {type(exc).__name__}: {exc}"):
            self._mark_failed(message, exc)
            message.ack()
        elif dead_letter_refusal(message.headers):
            message.requeue()
        else:
            message.reject(requeue=False)

    def dlx_unknown_message(self, message: Message) -> bool:
        # Acked here, without Celery's "Received and deleted unknown message" warning: it was not
        # deleted, and the quarantine line said where it went.
        if self._bury_raw(message, "undecodable: not a Celery task message (no task header)"):
            message.ack_log_error(logger, getattr(self, "connection_errors", ()))
            return True
        if dead_letter_refusal(message.headers):
            divert_reject(message, lambda log, errors, requeue=False: message.requeue())
        return False

    def dlx_unknown_task(self, message: Message, exc: Exception) -> None:
        self._divert(message, f"unknown task: {exc}")

    def dlx_invalid_task(self, message: Message, exc: Exception) -> None:
        self._divert(message, f"undecodable: invalid task message: {exc}")
        self._mark_failed(message, exc)
