"""The DLX service's log of fates: one line per batch and fate, not one per dead letter.

A service settling thousands of dead letters a second would otherwise write as many lines (and
spend a tenth of its time on them). Each line counts a batch's letters of one fate by queue and
cause, with one example each (message id, attempt, delay, reason); burials at ERROR, the rest at
INFO, as the runtime logs single fates. With DEBUG on for this logger, every letter's own line
follows. The fates themselves are in the failure history and the graveyard, one entry each.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from celery_dlx.fates import BURIED, FateEvent

logger = logging.getLogger(__name__)

#: Most queue-and-cause groups one line names; the rest are counted.
GROUPS_LIMIT = 10


def fate_lines(events: Sequence[FateEvent]) -> list[tuple[int, str]]:
    """``(level, line)`` per fate among ``events``, in the order fates first appear. Pure."""
    by_fate: dict[str, dict[tuple[str, str], list[FateEvent]]] = {}
    for event in events:
        by_fate.setdefault(event.fate, {}).setdefault((event.queue, event.cause), []).append(event)
    lines = []
    for fate, groups in by_fate.items():
        count = sum(len(g) for g in groups.values())
        parts = [_group(queue, cause, group) for (queue, cause), group in groups.items()]
        if len(parts) > GROUPS_LIMIT:
            parts[GROUPS_LIMIT:] = [f"and {len(parts) - GROUPS_LIMIT} more queue/cause group(s)"]
        level = logging.ERROR if fate == BURIED else logging.INFO
        lines.append((level, f"DLX service {fate} {count} dead letter(s): {'; '.join(parts)}"))
    return lines


def _group(queue: str, cause: str, group: list[FateEvent]) -> str:
    first = group[0]
    example = f"{first.task or '-'}[{first.message_id}] attempt={first.attempt}"
    if first.delay is not None:
        example += f" delay={first.delay:.3f}s"
    if first.reason:
        example += f" reason={first.reason}"
    return f"{len(group)} in queue={queue} cause={cause or '-'} (e.g. {example})"


def log_fates(events: Sequence[FateEvent]) -> None:
    """Log ``events`` (a settled batch's fates): :func:`fate_lines`, then with DEBUG each one."""
    if not events:
        return
    for level, line in fate_lines(events):
        logger.log(level, "%s", line)
    if logger.isEnabledFor(logging.DEBUG):
        for e in events:
            logger.debug(
                "%s %s[%s] attempt=%d queue=%s cause=%s%s",
                e.fate,
                e.task or "-",
                e.message_id,
                e.attempt,
                e.queue,
                e.cause or "-",
                f" reason={e.reason}" if e.reason else "",
            )
