"""One BROKER_ERRORS tuple (celery_dlx.broker.errors) for the drain, the DLX service and replay."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from amqp.exceptions import ChannelError, ConnectionForced, NotFound, RecoverableConnectionError
from kombu.exceptions import OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError

from celery_dlx.broker.errors import BROKER_ERRORS
from celery_dlx.drain import core as drain
from celery_dlx.errors import ConfigurationError, PublishError, TopologyError
from celery_dlx.service import outage

PACKAGE = Path(__file__).resolve().parents[2] / "celery_dlx"


@pytest.mark.parametrize(
    ("error", "is_broker_error"),
    [
        (PublishError("nacked"), True),
        (OperationalError("connection refused"), True),
        (ConnectionForced("shutdown"), True),
        (RecoverableConnectionError("lost"), True),
        (ChannelError("channel closed"), True),
        (NotFound("no queue"), True),
        (ConnectionResetError(), True),
        (ConnectionRefusedError(), True),
        (TimeoutError(), True),
        (OSError("broken pipe"), True),
        # Redis is not the broker; a bad configuration or topology is not an outage.
        (RedisConnectionError("down"), False),
        (ConfigurationError("bad"), False),
        (TopologyError("args differ"), False),
        (ValueError("bug"), False),
        (KeyError("bug"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_which_errors_are_broker_errors(error: BaseException, is_broker_error: bool) -> None:
    assert isinstance(error, BROKER_ERRORS) is is_broker_error


def test_the_service_retries_broker_and_redis_errors_alike() -> None:
    assert set(BROKER_ERRORS) <= set(outage.TRANSIENT_ERRORS)
    assert drain.BROKER_ERRORS is BROKER_ERRORS and outage.BROKER_ERRORS is BROKER_ERRORS


def test_no_other_module_defines_a_broker_error_tuple() -> None:
    defined = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id == "BROKER_ERRORS":
                    defined.append(path.relative_to(PACKAGE).as_posix())
    assert defined == ["broker/errors.py"]
