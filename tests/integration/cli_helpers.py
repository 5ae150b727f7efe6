"""Helpers of the ``celery dlx`` command tests: run commands, compile the shop protos, publish."""

from __future__ import annotations

import base64
import importlib
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import amqp
from celery.bin.base import CLIContext
from click.testing import Result

from celery_dlx.broker.topology import dead_letter_arguments, service_queue
from celery_dlx.cli.main import dlx
from tests.cli_runner import cli_runner
from tests.fixtures.codecs.protos import compile_descriptor_set, compile_python


def run(app: Any, *args: str, input: str | None = None, columns: int = 200) -> Result:
    """Run ``celery dlx ARGS`` on ``app`` with Click's runner (stderr kept apart), in a terminal
    ``columns`` wide."""
    runner = cli_runner(env={"COLUMNS": str(columns)})
    obj = CLIContext(app=app, no_color=True, workdir=None)
    return runner.invoke(dlx, list(args), obj=obj, input=input, catch_exceptions=False)


def run_json(app: Any, *args: str, code: int = 0) -> Any:
    """Run a command with ``--json``, check its exit code, return the parsed output."""
    result = run(app, *args, "--json")
    assert result.exit_code == code, (result.exit_code, result.output, result.stderr)
    return json.loads(result.stdout)


def shop_protos(out: Path) -> tuple[Path, Any]:
    """The shop's descriptor set and its generated ``events_pb2`` module (both compiled now)."""
    descriptor_set = compile_descriptor_set(out)
    compile_python(out)
    sys.path.insert(0, str(out))
    try:
        module = importlib.import_module("events_pb2")
        return descriptor_set, importlib.reload(module)
    finally:
        sys.path.remove(str(out))


def b64(message: Any) -> bytes:
    """A protobuf message as the seeds send it: base64 of its wire bytes."""
    return base64.b64encode(message.SerializeToString())


def declare_foreign_queue(conn: Any, app: Any, name: str) -> None:
    """Declare the DLX topology of ``app`` and a foreign work queue dead-lettering to it."""
    conf = app.conf
    channel = conn.default_channel
    service_queue(conf.dlx_service_queue, conf.dlx_exchange)(channel).declare()
    channel.queue_declare(
        name, durable=True, arguments=dead_letter_arguments(name, conf.dlx_exchange)
    )


def publish_and_reject(conn: Any, queue: str, bodies: list[tuple[bytes, str]]) -> list[str]:
    """Publish ``(body, content_type)`` messages to ``queue``, then reject each (a foreign consumer
    giving up). Returns their message ids."""
    channel = conn.connection.channel()
    ids = []
    for body, content_type in bodies:
        mid = f"m-{uuid.uuid4().hex[:12]}"
        ids.append(mid)
        msg = amqp.Message(body, content_type=content_type, message_id=mid, delivery_mode=2)
        channel.basic_publish(msg, exchange="", routing_key=queue)
    for _ in bodies:
        got = None
        while got is None:
            got = channel.basic_get(queue, no_ack=False)
        channel.basic_reject(got.delivery_tag, requeue=False)
    channel.close()
    return ids
