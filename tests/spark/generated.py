"""A small generated failure history whose aggregates are worked out by hand in the tests.

Day 1 is 2024-03-04 (UTC), day 2 the day after. Groups (queue, task, cause):

* A  orders / shop.charge / c-timeout, day 1: messages a0..a39 are requeued once; a0..a29 recover
  after 1..30 s; a30..a39 are then parked, drained and buried (3 failures each).
* B  orders / shop.charge / c-db, day 1: b0..b9 are parked and drained; b0..b4 recover after
  10..50 s; b5..b9 are buried; b5 and b6 are replayed, and b5 recovers 8 h 2 s after its first
  failure; b7 is purged, b8 archived with an obituary.
* C  emails / mail.send / c-smtp, day 1: e0..e4 requeued, never recover.
* D  orders / shop.refund / c-late, day 1 23:59: r0 requeued, recovers at day 2 00:01 (120 s).
* E  legacy / (no task) / (no cause), day 1: f0..f2 buried (a foreign producer's messages).
* A2 orders / shop.charge / c-timeout, day 2: a40..a43 requeued; a40 and a41 recover after 60 s
  and 120 s with no ``first_failure_ms`` on their recovered events.

Plus five malformed entries on day 1: a missing ``at_ms``, an ``attempt`` of "two", an unknown
fate, an obituary that is not JSON, a ``delay`` of "soon".
"""

from __future__ import annotations

from typing import Any

DAY1 = 1709510400000  # 2024-03-04T00:00:00Z
DAY2 = DAY1 + 86400000
H = 3600000
M = 60000
S = 1000

#: Expected counts of the generated history.
VALID = 151
MALFORMED = {"missing_field": 1, "bad_number": 2, "unknown_fate": 1, "bad_json": 1}


def _event(
    fate: str,
    at: int,
    queue: str,
    task: str,
    mid: str,
    attempt: int,
    cause: str,
    exc: str,
    first: int | None,
    delay: str = "",
    **extra: str,
) -> tuple[int, dict[str, str]]:
    fields = {
        "fate": fate,
        "at_ms": str(at),
        "queue": queue,
        "task": task,
        "message_id": mid,
        "attempt": str(attempt),
        "cause": cause,
        "exc_type": exc,
        "reason": "",
        "delay": delay,
        "importance": "notify",
        "first_failure_ms": "" if first is None else str(first),
    }
    fields.update(extra)
    return at, fields


def _group_a(out: list[tuple[int, dict[str, str]]]) -> None:
    args = ("orders", "shop.charge")
    cause = ("c-timeout", "requests.exceptions.Timeout")
    for i in range(40):
        t = DAY1 + 8 * H + i * M
        mid = f"a{i}"
        out.append(_event("requeued", t, *args, mid, 1, *cause, t))
        if i < 30:
            out.append(_event("recovered", t + (i + 1) * S, *args, mid, 1, *cause, t))
        else:
            out.append(_event("parked", t + 10 * S, *args, mid, 2, *cause, t, "30.000"))
            out.append(_event("drained", t + 40 * S, *args, mid, 2, *cause, t))
            out.append(_event("buried", t + 50 * S, *args, mid, 3, *cause, t))
    for k in range(4):
        t = DAY2 + 3 * H + k * M
        mid = f"a{40 + k}"
        out.append(_event("requeued", t, *args, mid, 1, *cause, t))
        if k < 2:
            out.append(_event("recovered", t + (k + 1) * M, *args, mid, 1, *cause, None))


def _group_b(out: list[tuple[int, dict[str, str]]]) -> None:
    args = ("orders", "shop.charge")
    cause = ("c-db", "psycopg2.OperationalError")
    for j in range(10):
        t = DAY1 + 12 * H + j * M
        mid = f"b{j}"
        out.append(_event("parked", t, *args, mid, 1, *cause, t, "10.000"))
        out.append(_event("drained", t + 10 * S, *args, mid, 1, *cause, t))
        if j < 5:
            out.append(_event("recovered", t + (j + 1) * 10 * S, *args, mid, 1, *cause, t))
        else:
            out.append(_event("buried", t + 15 * S, *args, mid, 2, *cause, t))
    for j in (5, 6):
        t = DAY1 + 20 * H + j * M
        out.append(_event("replayed", t, *args, f"b{j}", 2, *cause, DAY1 + 12 * H + j * M))
    b5_first = DAY1 + 12 * H + 5 * M
    out.append(_event("recovered", b5_first + 8 * H + 2 * S, *args, "b5", 2, *cause, b5_first))
    out.append(_event("purged", DAY1 + 21 * H, *args, "b7", 2, *cause, None))
    obituary = '{"message_id":"b8","cause":"c-db","attempts":[1,2]}'
    out.append(_event("archived", DAY1 + 22 * H, *args, "b8", 2, *cause, None, obituary=obituary))


def _groups_cde(out: list[tuple[int, dict[str, str]]]) -> None:
    smtp = ("c-smtp", "smtplib.SMTPServerDisconnected")
    for k in range(5):
        t = DAY1 + 9 * H + k * M
        out.append(_event("requeued", t, "emails", "mail.send", f"e{k}", 1, *smtp, t))
    t = DAY1 + 23 * H + 59 * M
    late = ("c-late", "TimeoutError")
    out.append(_event("requeued", t, "orders", "shop.refund", "r0", 1, *late, t))
    out.append(_event("recovered", t + 2 * M, "orders", "shop.refund", "r0", 1, *late, t))
    for k in range(3):
        t = DAY1 + 6 * H + k * M
        out.append(_event("buried", t, "legacy", "", f"f{k}", 1, "", "", t))


def _malformed(out: list[tuple[int, dict[str, str]]]) -> None:
    args = ("orders", "shop.charge")
    cause = ("c-timeout", "requests.exceptions.Timeout")
    t = DAY1 + 8 * H + 5 * M + 500
    _, missing = _event("requeued", t, *args, "bad0", 1, *cause, t)
    del missing["at_ms"]
    out.append((t, missing))
    out.append(
        (t + 1, {**_event("requeued", t + 1, *args, "bad1", 1, *cause, t)[1], "attempt": "two"})
    )
    out.append(_event("exploded", t + 2, *args, "bad2", 1, *cause, t))
    out.append(_event("archived", t + 3, *args, "bad3", 1, *cause, t, obituary="{not json"))
    out.append(_event("parked", t + 4, *args, "bad4", 1, *cause, t, "soon"))


def history() -> list[tuple[str, dict[str, str]]]:
    """Every entry as ``(stream id, fields)``, in stream order; ids follow the event times."""
    timed: list[tuple[int, dict[str, str]]] = []
    _group_a(timed)
    _group_b(timed)
    _groups_cde(timed)
    _malformed(timed)
    timed.sort(key=lambda item: item[0])
    entries = []
    last_ms, seq = -1, 0
    for at, fields in timed:
        seq = seq + 1 if at == last_ms else 0
        last_ms = at
        entries.append((f"{at}-{seq}", fields))
    return entries


def write(client: Any, key: str, entries: list[tuple[str, dict[str, str]]]) -> None:
    """XADD the entries with their own ids."""
    pipe = client.pipeline(transaction=False)
    for entry_id, fields in entries:
        pipe.xadd(key, fields, id=entry_id)
    pipe.execute()
