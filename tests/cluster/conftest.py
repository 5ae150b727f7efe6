"""The RabbitMQ cluster tests start three private RabbitMQ nodes and kill them: minutes of a
machine's time. They run only when ``DLX_CLUSTER=1`` (``tox -e cluster``,
``scripts/test-cluster.sh``); otherwise they are collected and skipped, whatever ``-m`` says."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    wanted = os.environ.get("DLX_CLUSTER") == "1"
    skip = pytest.mark.skip(reason="RabbitMQ cluster test: set DLX_CLUSTER=1 (tox -e cluster)")
    for item in items:
        if HERE not in Path(str(item.fspath)).resolve().parents:
            continue
        item.add_marker(pytest.mark.cluster)
        if not wanted:
            item.add_marker(skip)
