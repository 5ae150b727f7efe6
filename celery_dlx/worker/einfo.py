"""``LazyExceptionInfo`` (re-exported) and :func:`task_traceback`, a failure's text as the task's
author wants to read it."""

from __future__ import annotations

import os
import traceback
from types import TracebackType

import celery

from celery_dlx.compat.billiard import LazyExceptionInfo

__all__ = ["LazyExceptionInfo", "task_traceback"]

#: Folders whose frames call a task (celery_dlx's and Celery's own): a burial's traceback starts
#: below them, at the task's first frame.
_PLUMBING = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (os.path.dirname(os.path.abspath(__file__)), celery.__file__)
)


def _plumbing(tb: TracebackType) -> bool:
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PLUMBING)


def task_traceback(exc: BaseException) -> str:
    """``exc``'s traceback from the task's own frames on, so a burial does not read as a crash
    of celery_dlx or Celery; a failure raised by them alone keeps all frames."""
    first = exc.__traceback__
    while first is not None and _plumbing(first):
        first = first.tb_next
    shown = first if first is not None else exc.__traceback__
    return "".join(traceback.format_exception(type(exc), exc, shown))
