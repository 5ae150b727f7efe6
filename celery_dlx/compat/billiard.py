"""billiard internals celery_dlx relies on (checked on billiard 4.3.2, installed here, and 4.1.0,
the lowest stack's in ``tests/constraints/lowest.txt``, whose ``ExceptionInfo`` is the same).

Canary: ``tests/unit/test_compat_canaries.py`` (billiard section) and ``tests/unit/test_lazy_einfo.py``.
"""

from __future__ import annotations

import sys

from billiard.einfo import ExceptionInfo


class LazyExceptionInfo(ExceptionInfo):
    """billiard's ``ExceptionInfo`` of the exception being handled, built when first read.

    A requeue or park reads it only when the result backend stores the traceback or a
    ``task_retry`` receiver looks at ``einfo``; a burial always reads it (the obituary's
    traceback). Building one copies and formats the whole traceback, the largest single cost of
    a handled failure, so it is not built for nothing. Pickles as the built ``ExceptionInfo``.

    Internal: what billiard's ``ExceptionInfo.__init__`` sets (:data:`EINFO_ATTRS`, read here to
    know when to build it) and that its state is its instance ``__dict__`` (no ``__getstate__``).
    """

    def __init__(self) -> None:  # billiard's __init__ runs on first read
        self._exc_info = sys.exc_info()

    def __getattribute__(self, name: str) -> object:
        if name in EINFO_ATTRS:
            pending = object.__getattribute__(self, "__dict__").pop("_exc_info", None)
            if pending is not None:
                ExceptionInfo.__init__(self, pending)
        return object.__getattribute__(self, name)

    def __getstate__(self) -> dict[str, object]:
        _ = self.traceback  # built before it leaves the process
        return self.__dict__


#: What billiard's ExceptionInfo sets (class attributes, so ``__getattr__`` would never see them).
EINFO_ATTRS = frozenset({"type", "exception", "tb", "traceback", "internal", "exc_info"})
