"""Proposed changes to celery_dlx's worker, patched into a benchmark worker to measure them.

Nothing here is used by celery_dlx itself: ``bench_app`` applies these when
``BENCH_EXPERIMENTS`` names them, so a benchmark can show what a change to code another
engineer owns (``celery_dlx/worker/task.py``) would buy before it is made.
"""

from __future__ import annotations

import sys
from typing import Any

from billiard.einfo import ExceptionInfo
from celery.exceptions import Ignore


class LazyExceptionInfo:
    """Holds ``sys.exc_info()``; builds billiard's ExceptionInfo on first attribute read."""

    def __init__(self) -> None:
        self._exc_info = sys.exc_info()
        self._built: ExceptionInfo | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._built is None:
            self._built = ExceptionInfo(self._exc_info)
            self._exc_info = (None, None, None)
        return getattr(self._built, name)


class QuietIgnore(Ignore):  # type: ignore[misc]
    """``Ignore`` as ``raise Ignore() from None``: its traceback does not chain the failure."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.__suppress_context__ = True


def cache_code_positions() -> None:
    """billiard's ExceptionInfo copies ``list(code.co_positions())`` of every frame's code object
    (Python >= 3.11): thousands of tuples for Celery's large ``trace_task``, three times per
    handled failure. Code objects do not change: compute each list once and share it.
    """
    import weakref

    from billiard import einfo

    cache: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
    original = einfo._Code.__init__

    def positions(code: Any) -> list[Any]:
        found = cache.get(code)
        if found is None:
            found = cache[code] = list(code.co_positions())
        return found

    def init(self: Any, code: Any) -> None:
        original(self, _NoPositions(code))
        self._co_positions = positions(code)

    einfo._Code.__init__ = init


class _NoPositions:
    """A code object whose ``co_positions()`` is empty (billiard's copy is then filled from a cache)."""

    def __init__(self, code: Any) -> None:
        self._code = code

    def __getattr__(self, name: str) -> Any:
        return getattr(self._code, name)

    def co_positions(self) -> Any:
        return iter(())


def apply(app: Any, experiments: set[str]) -> None:
    from celery_dlx.worker import task as task_module

    unknown = experiments - {"lazy_einfo", "quiet_ignore", "no_events", "einfo_positions"}
    if unknown:
        raise ValueError(f"unknown BENCH_EXPERIMENTS: {sorted(unknown)}")
    if "lazy_einfo" in experiments:
        task_module.ExceptionInfo = LazyExceptionInfo  # type: ignore[misc,assignment]
    if "quiet_ignore" in experiments:
        task_module.Ignore = QuietIgnore  # type: ignore[misc]
    if "einfo_positions" in experiments:
        cache_code_positions()
    if "no_events" in experiments:
        app.conf.dlx_send_events = False
