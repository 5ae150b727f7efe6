"""The obituary hook: each new obituary sent to the task named by ``dlx_obituary_task``."""

from __future__ import annotations

import logging

from celery import Celery

from celery_dlx.message.obituary import HOOK_PAYLOAD_LIMIT, Obituary

logger = logging.getLogger(__name__)


def send_to_hook(app: Celery, task_name: str | None, obituary: Obituary) -> bool:
    """Send ``obituary`` (JSON-safe) to the hook task ``task_name`` (``dlx_obituary_task``).

    The obituary is already in the graveyard: a failure to send is logged and swallowed (False).
    An obituary of the hook task itself is not sent to it, so a failing hook cannot feed itself.
    """
    if not task_name or obituary.task == task_name:
        return False
    try:
        app.send_task(
            task_name,
            args=[obituary.json_safe(payload_limit=HOOK_PAYLOAD_LIMIT)],
            serializer="json",
        )
    except Exception:  # the hook is best effort: the graveyard holds the obituary
        logger.warning(
            "obituary hook %s could not be sent for obituary %s (message %s); the obituary is kept",
            task_name,
            obituary.id,
            obituary.message_id,
            exc_info=True,
        )
        return False
    return True
