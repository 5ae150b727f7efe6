"""On the solo pool, a DLX task's ack is written on the event loop's next turn, not its next timer.

``Request.acknowledge`` hands ``basic.ack`` to kombu's ``Hub.call_soon``. On the solo pool the
run happens on the loop's thread, usually inside a ready callback, and kombu's loop then polls
without looking at what callbacks scheduled (``Hub.create_loop``): the ack waits for the next
socket event or timer, up to ten seconds, and once a prefetch window's acks wait so the broker
sends nothing more. ``benchmarks/solo_stall.py`` measured 20-53 tasks/s instead of some 2,500.

The wake-up: a pipe registered with the loop as a reader; a DLX task's ack (or reject) on the
loop thread writes a byte to it, once per turn, so the next poll returns at once. The fix
proposed upstream is in ``docs/upstream.md``.

Needed on the solo pool, and on every pool below kombu 5.7: there ``call_soon`` from another
thread (the threads pool's acks, the settler's) does not wake the loop
(:func:`celery_dlx.compat.kombu.hub_wakes_for_other_threads`), so those threads write the pipe
too. Prefork's acks run in the poll's own callbacks and need no wake-up.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from celery import bootsteps

from celery_dlx.compat.celery import worker_pool_name
from celery_dlx.compat.kombu import hub_wakes_for_other_threads
from celery_dlx.wiring.runtime import get_runtime

if TYPE_CHECKING:
    from celery import Celery
    from celery.worker import WorkController


class Hub(Protocol):
    """What :class:`LoopWake` uses of the worker's event loop (kombu's ``Hub``)."""

    def add_reader(self, fds: int, callback: Callable[..., object], *args: object) -> None: ...

    def remove_reader(self, fd: int) -> None: ...


#: Attribute of an app holding its worker's :class:`LoopWake`.
_WAKE_ATTR = "_celery_dlx_loop_wake"


def loop_wake_of(app: Celery) -> LoopWake | None:
    """The wake-up of ``app``'s worker loop, when its worker runs the solo pool."""
    wake: LoopWake | None = app.__dict__.get(_WAKE_ATTR)
    return wake


class LoopWake:
    """A pipe whose read end is a reader of the worker's event loop: :meth:`nudge` makes the
    loop's next poll return at once."""

    def __init__(self, *, other_threads: bool = False) -> None:
        #: nudges from other threads than the loop's write to the pipe too (kombu before 5.7)
        self.other_threads = other_threads
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        #: the loop's thread (the one that registered the pipe): only its acks wait
        self._thread: int | None = None
        #: a byte is in the pipe, not read yet: the next poll returns at once
        self.armed = False

    def register(self, hub: Hub) -> None:
        """Add the pipe to ``hub``'s readers (again after a reconnection), on the loop's thread."""
        self._thread = threading.get_ident()
        hub.add_reader(self._read_fd, self._on_readable)

    def nudge(self) -> None:
        """Make the loop's next poll return at once (from other threads only with
        ``other_threads``)."""
        if self.armed or (not self.other_threads and threading.get_ident() != self._thread):
            return
        self.armed = True
        with contextlib.suppress(BlockingIOError):  # full: the loop wakes anyway
            os.write(self._write_fd, b"\0")

    def _on_readable(self) -> None:
        # Drain first: cleared first, a byte another thread wrote in between would be drained
        # here with the flag left set, and no nudge would write again.
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read_fd, 4096):
                pass
        self.armed = False

    def close(self, hub: Hub | None = None) -> None:
        if hub is not None:
            with contextlib.suppress(Exception):
                hub.remove_reader(self._read_fd)
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


class LoopWakeStep(bootsteps.StartStopStep):
    """Worker bootstep giving a solo-pool worker's loop a :class:`LoopWake`."""

    name = "celery_dlx.worker.loopwake"
    requires = ("celery.worker.components:Hub",)

    def __init__(self, parent: WorkController, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.wake: LoopWake | None = None
        self.hub: Hub | None = None

    def include_if(self, parent: WorkController) -> bool:
        pool_name = worker_pool_name(parent)
        return bool(
            get_runtime(parent.app).config.enabled
            and getattr(parent, "use_eventloop", False)
            and (pool_name == "solo" or not hub_wakes_for_other_threads())
        )

    def create(self, parent: WorkController) -> None:
        self.wake = LoopWake(other_threads=not hub_wakes_for_other_threads())
        parent.app.__dict__[_WAKE_ATTR] = self.wake

    def register_with_event_loop(self, parent: WorkController, hub: Hub) -> None:
        if self.wake is not None:
            self.hub = hub
            self.wake.register(hub)

    def stop(self, parent: WorkController) -> None:
        if self.wake is None:
            return
        if parent.app.__dict__.get(_WAKE_ATTR) is self.wake:
            del parent.app.__dict__[_WAKE_ATTR]
        self.wake.close(self.hub)
        self.wake = None

    def terminate(self, parent: WorkController) -> None:
        self.stop(parent)
