"""Reading each message's fate back from celery_dlx: history stream, graveyard, result backend.

A message has reached its final fate when it is

* **buried**: its obituary is in the graveyard (``celery_dlx.ops.obituaries.list_obituaries``);
* **recovered**: its history has a ``recovered`` entry (it failed, then a retry succeeded);
* **done**: its Celery result is ``SUCCESS`` with no failure before, or, for a foreign event,
  the fulfilment service acked it.

Result states are read before the history: a task records ``recovered`` before its result is
stored, so a ``SUCCESS`` read first always finds its ``recovered`` entry.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from celery_dlx.message.obituary import Obituary
from celery_dlx.ops.obituaries import list_obituaries

from .story import BURIED, DONE, RECOVERED, Tracked
from .world import Ledger

#: Fates a path shows; ``drained`` (the republish of a parked retry) is left out as routine.
PATH_FATES = {"requeued": "requeue", "parked": "park", "buried": "bury", "recovered": "ok"}
#: Within one millisecond, a republish precedes the run it causes.
_RANK = {"drained": 0, "replayed": 0}


@dataclass(frozen=True)
class Fate:
    """The final fate of one tracked message, as far as it is known."""

    tracked: Tracked
    fate: str | None
    runs: int | None
    detail: str
    path: str
    state: str
    obituary: Obituary | None = None

    @property
    def final(self) -> bool:
        return self.fate is not None

    @property
    def as_expected(self) -> bool:
        return self.fate == self.tracked.expect


def history_by_message(
    entries: Sequence[tuple[str, dict[str, str]]],
) -> dict[str, list[dict[str, str]]]:
    """History entries per message id, in the order their fate changes happened."""
    out: dict[str, list[dict[str, str]]] = defaultdict(list)
    for _, fields in entries:
        out[fields.get("message_id", "")].append(fields)
    for rows in out.values():
        rows.sort(key=lambda f: (int(f.get("at_ms") or 0), _RANK.get(f.get("fate", ""), 1)))
    return out


def _path(rows: list[dict[str, str]], done: bool) -> str:
    steps = [PATH_FATES[r["fate"]] for r in rows if r.get("fate") in PATH_FATES]
    if not steps and done:
        steps = ["ok"]
    return " > ".join(steps)


def fates(runtime: Any, tracked: Sequence[Tracked], ledger: Ledger, since: str = "-") -> list[Fate]:
    """The fate of every tracked message now.

    Args:
        runtime: the app's celery_dlx runtime (its Redis, key prefix and app).
        tracked: the messages of the story.
        ledger: the fulfilment service's record of acked events.
        since: first history stream id of the run.
    """
    app = runtime.app
    states = {t.message_id: app.AsyncResult(t.message_id).state for t in tracked if t.task}
    history = history_by_message(runtime.history.read(since))
    obits = {ob.message_id: ob for ob in list_obituaries(runtime, limit=None)}
    out = []
    for t in tracked:
        rows = history.get(t.message_id, [])
        state = states.get(t.message_id, "-")
        ob = obits.get(t.message_id)
        recovered = [r for r in rows if r.get("fate") == "recovered"]
        if ob is not None:
            fate, runs, detail = BURIED, ob.attempt, ob.reason
        elif recovered:
            failures = int(recovered[-1].get("attempt") or 0)
            fate, runs, detail = RECOVERED, failures + 1, f"after {failures} failed run(s)"
        elif (t.task and state == "SUCCESS") or (
            not t.task and ledger.outcome(t.message_id) == "acked"
        ):
            fate, runs, detail = DONE, 1, ""
        else:
            fate, runs, detail = None, None, "waiting"
        out.append(Fate(t, fate, runs, detail, _path(rows, fate == DONE), state, ob))
    return out


def table(rows: Sequence[Fate]) -> str:
    """The final table: message, kind, fate, runs, path, Celery result state."""
    head = ("message", "kind", "final fate", "runs", "path", "result")
    body = []
    for f in rows:
        if f.fate == BURIED:
            detail = f.detail if len(f.detail) <= 60 else f.detail[:57] + "..."
            text = f"buried: {detail}"
        elif f.fate == RECOVERED:
            text = f"recovered {f.detail}"
        else:
            text = f.fate or "NO FATE YET"
        if f.final and not f.as_expected:
            text += f"  (expected {f.tracked.expect})"
        body.append(
            (
                f.tracked.label,
                f.tracked.kind,
                text,
                "-" if f.runs is None else str(f.runs),
                f.path or "-",
                f.state,
            )
        )
    widths = [max(len(r[i]) for r in (head, *body)) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in body]
    return "\n".join(lines)


def describe(fields: dict[str, str], label: str, elapsed: float) -> str:
    """One line of the live view for one history entry."""
    fate = fields.get("fate", "?")
    parts = [f"  +{elapsed:5.1f}s  {fate:<10} {label:<16} attempt {fields.get('attempt', '?')}"]
    exc = fields.get("exc_type") or ""
    if exc and fate != "recovered":
        parts.append(exc.rsplit(".", 1)[-1])
    if fields.get("delay"):
        parts.append(f"back in {float(fields['delay']):g}s")
    if fate == "buried" and fields.get("reason"):
        parts.append(f"({fields['reason'][:70]})")
    return "  ".join(parts)
