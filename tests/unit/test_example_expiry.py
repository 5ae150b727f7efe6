"""example_project/README.md says which of a demo run's queues expire: the code agrees."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.conftest import ROOT

README = (ROOT / "example_project" / "README.md").read_text("utf-8")


@pytest.fixture
def example() -> Any:
    pytest.importorskip("grpc_tools")  # the example compiles its protobuf schema on import
    from example_project import app, fulfilment

    return app, fulfilment


def test_work_queues_expire_after_a_day(example: Any) -> None:
    app, fulfilment = example
    queues = {q.name: q for q in app.app.conf.task_queues}
    assert set(queues) == {app.ORDERS, app.SHIPPING}
    assert all(q.expires == 24 * 3600 for q in queues.values())
    assert fulfilment.QUEUE_EXPIRES == 24 * 3600
    text = re.sub(r"\s+", " ", README)
    assert (
        "(`<run>.orders`, `<run>.shipping`, `<run>.fulfilment`) delete themselves after a day"
        in text
    )


def test_the_dead_queue_and_the_exchanges_do_not_expire_and_the_readme_says_so(
    example: Any,
) -> None:
    app, _ = example
    from celery_dlx.broker.topology import service_queue

    dead = service_queue(app.DEAD, app.DLX_EXCHANGE)
    assert dead.expires is None and not (dead.queue_arguments or {}).get("x-expires")
    assert not dead.auto_delete and not dead.exchange.auto_delete
    assert not any(q.exchange.auto_delete for q in app.app.conf.task_queues)
    text = re.sub(r"\s+", " ", README)
    assert "`<run>.dead` never expires" in text
    assert "RabbitMQ has no expiry for exchanges" in text
