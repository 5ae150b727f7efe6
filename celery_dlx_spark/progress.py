"""Progress of a running export on stderr: the phase, Spark tasks done, history entries read."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO


class Progress:
    """Polls Spark's status tracker from a thread and prints a line when something moved.

    On a terminal the line is redrawn in place; otherwise (logs, CI) one line is printed at most
    every ``log_interval`` seconds, so a long export does not flood its log.
    """

    def __init__(
        self,
        spark: Any,
        counter: Any = None,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        poll: float = 0.5,
        log_interval: float = 10.0,
    ) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.counter = counter
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.poll = poll
        self.log_interval = log_interval
        self.phase = "starting"
        self.started = time.monotonic()
        self._last_line = ""
        self._last_print = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Progress:
        if self.enabled:
            self._thread = threading.Thread(
                target=self._run, name="dlx-export-progress", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.enabled and self.tty and self._last_line:
            self.stream.write("\n")
            self.stream.flush()

    def set_phase(self, phase: str) -> None:
        """Name what the export does now; printed at once."""
        self.phase = phase
        if self.enabled:
            self._show(force=True)

    def line(self) -> str:
        """The current progress line."""
        done = total = 0
        for stage_id in self.tracker.getActiveStageIds():
            info = self.tracker.getStageInfo(stage_id)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        parts = [f"dlx export: {self.phase}"]
        if total:
            parts.append(f"tasks {done}/{total}")
        if self.counter is not None and self.counter.value:
            parts.append(f"{self.counter.value:,} entries read")
        parts.append(f"{time.monotonic() - self.started:.0f}s")
        return " | ".join(parts)

    def _show(self, force: bool = False) -> None:
        text = self.line()
        now = time.monotonic()
        changed = text.rsplit(" | ", 1)[0] != self._last_line.rsplit(" | ", 1)[0]
        if self.tty:
            if changed or force or now - self._last_print >= 1.0:
                self.stream.write("\r\033[K" + text)
                self.stream.flush()
                self._last_print = now
        elif force or (changed and now - self._last_print >= self.log_interval):
            self.stream.write(text + "\n")
            self.stream.flush()
            self._last_print = now
        self._last_line = text

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self._show()
            except Exception:  # the JVM may be shutting down; progress is never worth a crash
                return
