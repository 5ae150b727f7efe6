"""Every Redis key comes from celery_dlx.message.names.Keys, with the exact names stored data uses.

The names are a storage format: Redis already holds data under them and the Spark job
(``spark/``, which cannot import celery_dlx) builds the history ones itself.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from celery_dlx.message.names import Keys

PACKAGE = Path(__file__).resolve().parents[2] / "celery_dlx"
K = Keys("shop")


@pytest.mark.parametrize(
    ("key", "name"),
    [
        (K.parked_due, "{shop}:parked:due"),
        (K.parked_meta, "{shop}:parked:meta"),
        (K.parked_body, "{shop}:parked:body"),
        (K.history, "{shop}:history"),
        (K.history_export, "{shop}:history:export"),
        (K.history_export_lock, "{shop}:history:export:lock"),
        (K.cause("m-1"), "{shop}:cause:m-1"),
        (K.graveyard("records"), "{shop}:graveyard:records"),
        (K.graveyard("queue:orders"), "{shop}:graveyard:queue:orders"),
        (K.counter(28_333_333), "{shop}:count:28333333"),
        (K.seen("orders|m-1|3"), "{shop}:seen:orders|m-1|3"),
        (K.replay_ledger, "{shop}:replay:ledger"),
        (K.consumerless, "{shop}:check:consumerless"),
        (K.budget("sentry") + "c0ffee", "{shop}:budget:sentry:c0ffee"),
        (K.web_audit, "{shop}:web:audit"),
        (K.drain_lease, "{shop}:drain:lease"),
        (K.requeued_by_task("m-1"), "{shop}:requeued-by-task:m-1"),
    ],
)
def test_key_names(key: str, name: str) -> None:
    assert key == name


@pytest.mark.parametrize("prefix", ["", "a b", "{x}", "x}"])
def test_prefixes_that_would_break_the_hash_tag_are_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="dlx_key_prefix"):
        Keys(prefix)


def test_no_module_but_names_builds_a_key_from_the_prefix() -> None:
    """A hash-tagged key (``{prefix}:...``) or a key prefix attribute glued to text elsewhere
    means a key name outside the one builder."""
    built = re.compile(r'"\{" \+|\.prefix\b|_prefix\}|_prefix \+')
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name == "message/names.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if built.search(line) and "keys" in line.lower():
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert offenders == []
