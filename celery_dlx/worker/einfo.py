"""``LazyExceptionInfo``: billiard's ``ExceptionInfo`` of a handled failure, built when first read;
and :func:`task_traceback`, the text of a failure as the task's author wants to read it."""

from __future__ import annotations

import os
import sys
import traceback
from types import TracebackType

import celery
from billiard.einfo import ExceptionInfo

#: Folders whose frames call a task (celery_dlx's and Celery's own): a burial's traceback starts
#: below them, at the task's first frame.
_PLUMBING = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep
    for path in (os.path.dirname(os.path.abspath(__file__)), celery.__file__)
)


def _plumbing(tb: TracebackType) -> bool:
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PLUMBING)


def task_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as Python prints it, from the task's own frames on: the frames of
    celery_dlx and Celery that ran the task (and caught its failure) are left out, so a burial's
    traceback does not read as a crash of either. A failure raised by them alone keeps them all.
    """
    first = exc.__traceback__
    while first is not None and _plumbing(first):
        first = first.tb_next
    shown = first if first is not None else exc.__traceback__
    return "".join(traceback.format_exception(type(exc), exc, shown))


class LazyExceptionInfo(ExceptionInfo):
    """billiard's ``ExceptionInfo`` of the exception being handled, built when first read.

    A requeue or park reads it only when the result backend stores the traceback or a
    ``task_retry`` receiver looks at ``einfo``; a burial always reads it (the obituary's
    traceback). Building one copies and formats the whole traceback, the largest single cost of
    a handled failure, so it is not built for nothing. Pickles as the built ``ExceptionInfo``.
    """

    def __init__(self) -> None:  # billiard's __init__ runs on first read
        self._exc_info = sys.exc_info()

    def __getattribute__(self, name: str) -> object:
        if name in _EINFO_ATTRS:
            pending = object.__getattribute__(self, "__dict__").pop("_exc_info", None)
            if pending is not None:
                ExceptionInfo.__init__(self, pending)
        return object.__getattribute__(self, name)

    def __getstate__(self) -> dict[str, object]:
        _ = self.traceback  # built before it leaves the process
        return self.__dict__


#: What billiard's ExceptionInfo sets (class attributes, so ``__getattr__`` would never see them).
_EINFO_ATTRS = frozenset({"type", "exception", "tb", "traceback", "internal", "exc_info"})
