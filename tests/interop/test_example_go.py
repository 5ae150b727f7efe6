"""The example project's Go consumer (example_project/go/labels.go), as its README tour runs it.

Built from Debian's Go packages in GOPATH mode, it declares its queue, rejects an event for an
unknown carrier and acks a good one; the DLX service requeues, parks and buries the bad one, and
the Go consumer reads every copy (printing the ``x-dlx-attempt`` it decoded).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_dlx.drain.core import drain_once
from celery_dlx.ops import obituaries
from celery_dlx.wiring.runtime import get_runtime
from tests.conftest import BROKER_URL, REDIS_URL, ROOT
from tests.integration.dlx_apps import service_thread
from tests.interop import clients

pytestmark = pytest.mark.integration


@pytest.fixture
def labels_binary(tmp_path: Path) -> Path:
    clients.require("go")
    binary = tmp_path / "labels"
    env = dict(os.environ, **clients.GO_ENV, GOCACHE=str(tmp_path / "gocache"))
    done = subprocess.run(
        ["go", "build", "-o", str(binary), "example_project/go/labels.go"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return binary


@pytest.fixture
def run(uid: str, redis_client: Any, broker: Any) -> Iterator[str]:
    name = f"tour-{uid}"
    yield name
    channel = broker.channel()
    for queue in (f"{name}.labels", f"{name}.dead"):
        channel.queue_delete(queue)
    channel.exchange_delete(f"{name}.dlx")
    for key in redis_client.scan_iter(match="{" + name + "}*", count=1000):
        redis_client.delete(key)


def test_the_tour_go_consumer_sees_every_copy_then_the_graveyard_keeps_it(
    labels_binary: Path, run: str, tmp_path: Path
) -> None:
    app = Celery(f"tour-{run}", broker=BROKER_URL, set_as_current=False)
    policy = {"max_requeues": 1, "max_parks": 1, "backoff": [0.2]}
    app.conf.update(
        dlx_redis_url=REDIS_URL,
        dlx_key_prefix=run,
        dlx_exchange=f"{run}.dlx",
        dlx_service_queue=f"{run}.dead",
        dlx_queues={f"{run}.labels": policy},
    )
    runtime = get_runtime(app)
    env = dict(os.environ, EXAMPLE_RUN=run, EXAMPLE_BROKER_URL=BROKER_URL)
    out = tmp_path / "labels.out"
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            drain_once(runtime)
            stop.wait(0.05)

    with service_thread(app), out.open("w") as log:
        consumer = subprocess.Popen([str(labels_binary)], env=env, stdout=log, stderr=log)
        drainer = threading.Thread(target=drain, daemon=True)
        drainer.start()
        try:
            deadline = time.monotonic() + 60
            while "consuming" not in out.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            for order, carrier in (("A-2001", "Owlpost"), ("A-2002", "DHL")):
                subprocess.run([str(labels_binary), "publish", order, carrier], env=env, check=True)
            deadline = time.monotonic() + 120
            while obituaries.count(runtime) < 1 and time.monotonic() < deadline:
                assert consumer.poll() is None, out.read_text()
                time.sleep(0.1)
            assert consumer.poll() is None, out.read_text()
        finally:
            stop.set()
            drainer.join(30)
            consumer.terminate()
            consumer.wait(30)
    text = out.read_text()
    assert "label printed for A-2002 via DHL" in text
    rejected = [line for line in text.splitlines() if "label-A-2001: no carrier" in line]
    # first delivery, then the requeued and the parked copies, decoded by the Go client
    assert [line.split("x-dlx-attempt=")[1].rstrip(")") for line in rejected] == [
        "<nil>",
        "1",
        "2",
    ]
    (ob,) = obituaries.list_obituaries(runtime)
    assert ob.message_id == "label-A-2001" and ob.attempt == 3
