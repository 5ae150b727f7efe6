"""Comparing header cells across the copies of a message, and the processes the comparison needs.

A typed consumer (``consume-typed`` of ``go/allfields.go``, ``node/allfields.js``,
``ruby/allfields.rb``, ``pika/allfields.py``) prints each header as a cell ``{"type":
"<tag>/<client type>", "value": <canonical value>}``, tables and arrays as cells of cells. Here the
cells are flattened into paths (``name``, ``name["key"]``, ``name[0]``) and every copy of a message
is compared with its first delivery, path by path: a type change, a value change (same type), a
path missing from the copy, or one added. celery_dlx's own ``x-dlx-*`` headers are left out; the
broker's ``x-death`` family is reported on its own: a copy carries none, but for the one the
broker itself dead-letters back from a TTL delay queue (``<queue>_dlq_<ms>``, reason ``expired``)
when parked retries wait in the broker (``dlx_delay_backend = "ttl"``).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from celery import Celery

from celery_dlx.broker.ladder import DELAY_QUEUE_INFIX
from celery_dlx.drain.core import drain_once
from celery_dlx.service.loop import DLXService
from celery_dlx.wiring.runtime import Runtime

#: Headers celery_dlx owns: they may be added or changed by any copy.
OWN_PREFIX = "x-dlx-"
#: Headers the broker owns: a copy celery_dlx republishes carries none of them.
BROKER_PREFIXES = ("x-death", "x-first-death-", "x-last-death-")
#: The deliveries of one message under the policy ``max_requeues=1, max_parks=1``.
CYCLE = ("first delivery", "requeue copy", "parked copy")
#: Then the graveyard is replayed: a fresh budget, the same cycle again.
EXPECTED = (*CYCLE, *(f"replay: {c}" for c in CYCLE))

#: A flattened header: path -> (type, canonical value as JSON text).
Cells = dict[str, tuple[str, str]]


def flatten(headers: dict[str, Any]) -> Cells:
    """The user headers of one delivery as paths to ``(type, value)`` (``x-dlx-*`` and the
    broker's ``x-death`` family left out)."""
    out: Cells = {}

    def walk(path: str, cell: Any) -> None:
        if not isinstance(cell, dict) or "type" not in cell:
            out[path] = ("?", json.dumps(cell, sort_keys=True, ensure_ascii=False))
            return
        value = cell.get("value")
        if isinstance(value, dict):
            out[path] = (cell["type"], "{table}")
            for key, sub in value.items():
                walk(f"{path}[{json.dumps(key, ensure_ascii=False)}]", sub)
        elif isinstance(value, list):
            out[path] = (cell["type"], "[array]")
            for i, sub in enumerate(value):
                walk(f"{path}[{i}]", sub)
        else:
            rest = {k: v for k, v in cell.items() if k != "type"}  # value, and pika's wire bytes
            out[path] = (cell["type"], json.dumps(rest, sort_keys=True, ensure_ascii=False))

    for name, cell in headers.items():
        if not name.startswith((OWN_PREFIX, *BROKER_PREFIXES)):  # the broker's: reported apart
            walk(name, cell)
    return out


@dataclass(frozen=True)
class Change:
    path: str
    kind: str  # type, value, missing, added
    before: str
    after: str

    def describe(self) -> str:
        return f"{self.path}: {self.kind} {self.before} -> {self.after}"


def compare(original: Cells, copy: Cells) -> list[Change]:
    """How ``copy`` differs from ``original``, path by path."""
    changes = []
    for path, (typ, value) in original.items():
        if path not in copy:
            changes.append(Change(path, "missing", f"{typ} {value}", "(absent)"))
            continue
        ctyp, cvalue = copy[path]
        if ctyp != typ:
            changes.append(Change(path, "type", f"{typ} {value}", f"{ctyp} {cvalue}"))
        elif cvalue != value:
            changes.append(Change(path, "value", f"{typ} {value}", f"{ctyp} {cvalue}"))
    for path in copy.keys() - original.keys():
        changes.append(Change(path, "added", "(absent)", " ".join(copy[path])))
    return changes


def broker_headers(headers: dict[str, Any]) -> list[str]:
    return sorted(name for name in headers if name.startswith(BROKER_PREFIXES))


def _text(cell: Any) -> str:
    return str(cell.get("value")) if isinstance(cell, dict) else ""


def from_ladder_only(headers: dict[str, Any], queue: str) -> bool:
    """Whether the broker headers say only "expired in one of ``queue``'s TTL delay queues"."""
    delay = f"{queue}{DELAY_QUEUE_INFIX}"
    deaths = headers.get("x-death", {}).get("value")
    if not isinstance(deaths, list) or not deaths:
        return False
    for death in deaths:
        fields = death.get("value") if isinstance(death, dict) else None
        if not isinstance(fields, dict):
            return False
        if _text(fields.get("reason")) != "expired" or not _text(fields.get("queue")).startswith(
            delay
        ):
            return False
    for name in broker_headers(headers):
        if name.endswith("-reason") and _text(headers[name]) != "expired":
            return False
        if name.endswith("-queue") and not _text(headers[name]).startswith(delay):
            return False
    return True


def label(headers: dict[str, Any]) -> str:
    """Which delivery of a message's cycle this is, from celery_dlx's own headers."""
    cell = headers.get("x-dlx-attempt")
    raw = cell.get("value") if isinstance(cell, dict) else None
    try:
        attempt = int(str(raw)) if raw is not None else 0
    except ValueError:
        attempt = -1
    name = CYCLE[attempt] if 0 <= attempt < len(CYCLE) else f"attempt {raw}"
    return f"replay: {name}" if "x-dlx-replayed" in headers else name


@dataclass
class MessageReport:
    """The deliveries of one message in one queue, compared with its first delivery."""

    message_id: str
    deliveries: list[dict[str, Any]]
    labels: list[str] = field(default_factory=list)
    cells: int = 0
    copies: int = 0
    changes: list[tuple[str, Change]] = field(default_factory=list)  # (copy label, change)
    broker: list[tuple[str, list[str]]] = field(default_factory=list)

    @classmethod
    def of(
        cls, message_id: str, deliveries: list[dict[str, Any]], *, ladder: bool = False
    ) -> MessageReport:
        """Compare the deliveries (``ladder``: parked copies come back from TTL delay queues)."""
        report = cls(message_id, deliveries)
        report.labels = [label(d["headers"]) for d in deliveries]
        for lab, d in zip(report.labels, deliveries, strict=True):
            found = broker_headers(d["headers"])
            returned = ladder and lab.endswith(CYCLE[2])
            if found and not (returned and from_ladder_only(d["headers"], d.get("queue", ""))):
                report.broker.append((lab, found))
        if not deliveries:
            return report
        original = flatten(deliveries[0]["headers"])
        for lab, d in zip(report.labels[1:], deliveries[1:], strict=True):
            report.copies += 1
            report.cells += len(original)
            report.changes.extend((lab, c) for c in compare(original, flatten(d["headers"])))
        return report

    def counts(self) -> Counter[str]:
        return Counter(change.kind for _, change in self.changes)

    def problems(self, expected: tuple[str, ...] = EXPECTED) -> list[str]:
        """Every way this message's deliveries differ from what the policy and fidelity ask."""
        out = []
        if sorted(self.labels) != sorted(expected):
            out.append(
                f"{self.message_id}: {len(self.labels)} deliveries {self.labels}, "
                f"expected {len(expected)} {list(expected)}"
            )
        if self.labels and self.labels[0] != "first delivery":
            out.append(f"{self.message_id}: the first delivery seen is a {self.labels[0]!r}")
        for lab, names in self.broker:
            out.append(f"{self.message_id} {lab}: carries broker headers {names}")
        # one line per (path, change), naming the copies it happened in
        grouped: dict[Change, list[str]] = {}
        for lab, change in self.changes:
            grouped.setdefault(change, []).append(lab)
        for change, labels in sorted(grouped.items(), key=lambda kv: kv[0].path):
            out.append(f"{self.message_id}: {change.describe()}   [in: {', '.join(labels)}]")
        return out


def by_message(deliveries: list[dict[str, Any]], queue: str) -> dict[str, list[dict[str, Any]]]:
    """A queue's deliveries per message_id, in arrival order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for d in deliveries:
        if d.get("queue") == queue:
            out.setdefault(d.get("message_id") or "(no message_id)", []).append(d)
    return out


# -- the DLX service and the drain, in threads that record how they ended ----------------------


@dataclass
class Watched:
    """A thread whose exception (if it raised) is kept, with its traceback."""

    name: str
    thread: threading.Thread | None = None
    error: str | None = None

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def died(self) -> str | None:
        """Why the thread ended before it was asked to (None while it runs or if it was asked)."""
        if self.error is not None:
            return f"the {self.name} raised:\n{self.error}"
        return None


def _watch(name: str, target: Callable[[], None]) -> Watched:
    watched = Watched(name)

    def run() -> None:
        try:
            target()
        except BaseException:  # the point is to see it, not to lose it in a thread
            watched.error = traceback.format_exc()

    watched.thread = threading.Thread(target=run, name=f"test-{name}", daemon=True)
    watched.thread.start()
    return watched


@contextlib.contextmanager
def service_and_drain(app: Celery, runtime: Runtime) -> Iterator[tuple[Watched, Watched]]:
    """The real DLX service and a drain loop in threads until the block ends.

    Unlike ``tests.integration.dlx_apps.service_thread``, an exception that ends the service is
    recorded (and reported by the tests) instead of ending the thread unseen.
    """
    svc = DLXService(app, runtime=runtime)
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            drain_once(runtime)
            stop.wait(0.05)

    service = _watch("DLX service", svc.run)
    drainer = _watch("drain loop", drain)
    try:
        yield service, drainer
    finally:
        svc.stop()
        stop.set()
        for watched in (service, drainer):
            assert watched.thread is not None
            watched.thread.join(30)


def wait_for(
    done: Callable[[], bool], give_up: Callable[[], str | None], timeout: float
) -> str | None:
    """Poll ``done`` until it holds (None), ``give_up`` names a reason, or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not done():
        reason = give_up()
        if reason:
            return reason
        if time.monotonic() > deadline:
            return f"timed out after {timeout:.0f}s"
        time.sleep(0.1)
    return None
