"""Quiet logs: Celery's own per-run lines that only repeat a celery_dlx fate line go to DEBUG.

A requeued or parked run ends with ``Ignore``, and Celery logs ``Task x[id] ignored`` at INFO
though celery_dlx logged the fate already. A buried run fails with the task's own exception:
Celery's ``raised unexpected`` ERROR is that burial's one traceback (the DLX service's
``buried`` line names the cause without it). :class:`CeleryEchoFilter` lowers the echoes
(``ignored``, and ``rejected`` for a fallback ``Reject`` when the copy could not be stored) to
DEBUG without traceback. Runs celery_dlx did not handle keep Celery's lines.
"""

from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from typing import Any

from celery import Celery, current_task

from celery_dlx.fates import PARKED, REQUEUED, FateEvent

#: Celery's logger of per-run outcomes.
TRACE_LOGGER = "celery.app.trace"
#: Message ids remembered between a fate change and Celery's line about the same run.
REMEMBER = 4096


class CeleryEchoFilter(logging.Filter):
    """Lowers Celery's ``ignored``/``rejected`` run lines of runs celery_dlx handled to DEBUG.

    Also a fate listener: a requeue or park recorded in this process marks its message, so the
    ``ignored`` line of exactly that run is lowered.
    """

    def __init__(self, app: Celery) -> None:
        super().__init__(TRACE_LOGGER)
        # A weak reference: the filter lives on a process-wide logger and must not keep the app.
        self._app = weakref.ref(app)
        self._handled: OrderedDict[str, str] = OrderedDict()

    @property
    def app(self) -> Celery | None:
        """The app this filter was installed for (None once it is gone)."""
        return self._app()

    def __call__(self, event: FateEvent) -> None:
        # Celery logs ``ignored`` at INFO: below that level (Celery's worker default is WARNING)
        # the line is never made, so there is nothing to lower and nothing to remember (each
        # remembered id would stay until 4096 newer ones push it out).
        if event.fate in (REQUEUED, PARKED) and logging.getLogger(TRACE_LOGGER).isEnabledFor(
            logging.INFO
        ):
            self._handled[event.message_id] = event.fate
            while len(self._handled) > REMEMBER:
                self._handled.popitem(last=False)

    @staticmethod
    def _dlx_run(task_id: Any) -> bool:
        """True when the run being logged is ``task_id``'s, of a DLX-enabled task (Celery logs
        before it pops the task; a task name alone is ambiguous: shared tasks join every app)."""
        task = current_task  # a proxy: false when no task is running
        if not task or getattr(task.request, "id", None) != task_id:
            return False
        enabled = getattr(task, "_dlx_enabled_for", None)
        return bool(callable(enabled) and enabled(task.app))

    def _echo(self, record: logging.LogRecord) -> bool:
        data = getattr(record, "data", None)
        if not isinstance(data, dict):
            return False
        description = data.get("description")
        if description == "ignored":
            return self._handled.pop(str(data.get("id")), None) is not None
        if description == "rejected" and record.exc_info:
            exc = record.exc_info[1]
            return getattr(exc, "requeue", True) is False and self._dlx_run(data.get("id"))
        return False

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            if record.name != TRACE_LOGGER or not self._echo(record):
                return True
        except Exception:  # a log filter must never break logging
            return True
        # Handlers check only their own level, so a lowered record must also be dropped unless
        # the logger really is at DEBUG.
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info, record.exc_text = None, None
        return logging.getLogger(TRACE_LOGGER).isEnabledFor(logging.DEBUG)


def install_log_filter(app: Celery) -> CeleryEchoFilter:
    """Attach a :class:`CeleryEchoFilter` for ``app`` to Celery's trace logger (once per app)."""
    trace = logging.getLogger(TRACE_LOGGER)
    for existing in list(trace.filters):
        if isinstance(existing, CeleryEchoFilter):
            if existing.app is app:
                return existing
            if existing.app is None:  # its app was garbage-collected
                trace.removeFilter(existing)
    echo = CeleryEchoFilter(app)
    trace.addFilter(echo)
    return echo
