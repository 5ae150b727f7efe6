"""The README's first command: ``python -m example_project.demo`` on the real broker and Redis.

The demo starts its own worker (prefork, with beat and the DLX service) and the fulfilment
consumer as subprocesses; this test runs it as a user would and reads the table it prints.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import BROKER_URL, REDIS_URL, ROOT

#: Seconds the whole demo may take (it needs about 15 on an idle machine).
DEMO_TIMEOUT = 240


def run_demo(run: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "EXAMPLE_BROKER_URL": BROKER_URL,
        "EXAMPLE_REDIS_URL": REDIS_URL,
        "PYTHONPATH": str(ROOT),
    }
    env.pop("EXAMPLE_RUN", None)
    return subprocess.run(
        [sys.executable, "-m", "example_project.demo", "--run", run, "--cleanup"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT,
        check=False,
    )


def table_rows(output: str) -> dict[str, dict[str, str]]:
    """The demo's final table, by message label."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("message "))
    head = re.split(r"\s{2,}", lines[start].strip())
    rows = {}
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == len(head), line
        rows[cells[0]] = dict(zip(head, cells, strict=True))
    return rows


@pytest.fixture
def demo(uid: str, redis_client: Any, broker: Any) -> Any:
    run = f"test-demo-{uid}"
    result = run_demo(run)
    yield run, result
    # --cleanup removed everything; if the demo died before that, remove what it left.
    for key in redis_client.scan_iter(match="{" + run + "}*", count=1000):
        redis_client.delete(key)
    channel = broker.channel()
    for queue in ("orders", "shipping", "fulfilment", "dead"):
        try:
            channel.queue_delete(f"{run}.{queue}")
        except Exception:
            channel = broker.channel()
    for exchange in ("dlx", "orders", "shipping"):
        try:
            channel.exchange_delete(f"{run}.{exchange}")
        except Exception:
            channel = broker.channel()


def test_demo_prints_every_fate_and_cleans_up(demo: Any, redis_client: Any, broker: Any) -> None:
    run, result = demo
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    rows = table_rows(result.stdout)
    assert len(rows) == 13

    def row(label: str) -> tuple[str, str, str, str]:
        r = rows[label]
        return r["final fate"], r["runs"], r["path"], r["result"]

    for label in ("A-1001 charge", "A-1002 charge", "A-1003 ship", "A-1011 import"):
        assert row(label) == ("done", "1", "ok", "SUCCESS")
    assert row("A-1004 charge") == (
        "recovered after 1 failed run(s)",
        "2",
        "requeue > ok",
        "SUCCESS",
    )
    assert row("A-1005 charge") == (
        "recovered after 2 failed run(s)",
        "3",
        "requeue > requeue > ok",
        "SUCCESS",
    )
    assert row("A-1006 ship") == ("recovered after 1 failed run(s)", "2", "park > ok", "SUCCESS")
    assert row("A-1007 charge") == (
        "buried: retry budget spent: 2 requeues, 3 parks (PaymentTimeout)",
        "6",
        "requeue > requeue > park > park > park > bury",
        "FAILURE",
    )
    assert row("A-1008 charge") == (
        "buried: permanent failure: CardDeclined",
        "1",
        "bury",
        "FAILURE",
    )
    assert row("A-1012 import") == (
        "buried: permanent failure: InvalidOrder",
        "1",
        "bury",
        "FAILURE",
    )
    fate, _, path, state = row("A-1013 import")
    assert fate.startswith("buried: undecodable: DecodeError") and path == "bury" and state == "-"
    assert row("A-1009 event") == ("done", "1", "ok", "-")
    assert row("A-1010 event") == (
        "buried: retry budget spent: 1 requeue, 1 park (Rejected)",
        "3",
        "requeue > park > bury",
        "-",
    )
    # The foreign event was decoded with the descriptor set compiled at demo start.
    assert "decoded with the descriptor set: shop.fulfilment.v1.OrderPlaced" in result.stdout
    assert "'warehouse': 'XXX'" in result.stdout
    assert "every message reached its fate: 5 done, 3 recovered, 5 buried" in result.stdout
    # Fate changes were printed live, before the table.
    assert re.search(r"\+\s*\d+\.\ds\s+parked\s+A-1006 ship", result.stdout)
    # --cleanup left nothing of the run behind.
    assert list(redis_client.scan_iter(match="{" + run + "}*", count=1000)) == []
    channel = broker.channel()
    with pytest.raises(Exception, match=r"NOT_FOUND|404"):
        channel.queue_declare(f"{run}.orders", passive=True)
