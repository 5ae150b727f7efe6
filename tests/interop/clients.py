"""The foreign AMQP clients of the interop tests: build or locate each, run it, read its log.

Each client is a real consumer on RabbitMQ's own client library for its language (Go's amqp091-go,
Node's amqplib, Ruby's bunny). It rejects every delivery (requeue=false) and prints one JSON line
per delivery with the headers it decoded. The all-types programs (``go/allfields.go``,
``node/allfields.js``, ``ruby/allfields.rb``, ``pika/allfields.py``) publish every header field
type their client writes and print each header as a typed cell (issue 21). A client whose
toolchain is missing is installed by ``scripts/interop-setup.sh`` (run once per session here too);
if that cannot install it, its tests skip with the reason, except under ``CI``, where they fail.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BROKER_URL, ROOT

HERE = Path(__file__).resolve().parent
#: GOPATH mode against Debian's packaged Go sources: no module download, no network.
GO_ENV = {"GOPATH": "/usr/share/gocode", "GO111MODULE": "off", "GOFLAGS": "", "GOPROXY": "off"}

_setup_lock = threading.Lock()
_setup_done: list[bool] = []


def amqp_url() -> str:
    """The test broker as the foreign clients spell it (``/`` vhost percent-encoded)."""
    return BROKER_URL[:-2] + "/%2F" if BROKER_URL.endswith("//") else BROKER_URL


def run_setup() -> None:
    """``scripts/interop-setup.sh`` once per test session (quick when all is installed)."""
    with _setup_lock:
        if _setup_done:
            return
        _setup_done.append(True)
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "interop-setup.sh")],
            check=False,
            timeout=900,
            env=dict(os.environ, CI=""),  # report here, as a skip or a CI failure below
        )


def unavailable(reason: str) -> None:
    """Skip (a developer machine without the toolchain) or fail (CI must run every client)."""
    if os.environ.get("CI"):
        pytest.fail(f"interop client unavailable in CI: {reason}")
    pytest.skip(f"{reason} (scripts/interop-setup.sh could not install it)")


def _ruby_ok() -> bool:
    if shutil.which("ruby") is None:
        return False
    check = subprocess.run(
        ["ruby", "-e", 'require "bunny"'], capture_output=True, timeout=60, check=False
    )
    return check.returncode == 0


def _go_ok() -> bool:
    return (
        shutil.which("go") is not None
        and Path(GO_ENV["GOPATH"], "src/github.com/rabbitmq/amqp091-go").is_dir()
    )


def _node_ok() -> bool:
    return shutil.which("node") is not None and (HERE / "node/node_modules/amqplib").is_dir()


def _pika_ok() -> bool:
    return importlib.util.find_spec("pika") is not None


_CHECKS = {"go": _go_ok, "node": _node_ok, "ruby": _ruby_ok, "pika": _pika_ok}

#: Field tags each client cannot read: a delivery carrying one closes amqp091-go's connection
#: (``ErrSyntax``) or kills bunny's reader thread, so the all-types publishers leave them out of
#: the messages for that consumer. amqplib and pika read every tag RabbitMQ knows.
UNREADABLE = {"go": "ui", "node": "", "ruby": "Bui", "pika": ""}
#: The messages each all-types publisher (``publish-all``) sends to every queue it is given.
ALL_TYPES_MESSAGES = {
    "go": ("go-all",),
    "node": ("node-all",),
    "ruby": ("ruby-all", "ruby-binary"),
    "pika": ("pika-all",),
}


def available(client: str) -> bool:
    """Whether ``client``'s toolchain is here, installing it once if not (never skips)."""
    if _CHECKS[client]():
        return True
    run_setup()
    return _CHECKS[client]()


def require(client: str) -> None:
    """Make sure ``client``'s toolchain is here, installing it once if not; else skip/fail."""
    if _CHECKS[client]():
        return
    run_setup()
    if not _CHECKS[client]():
        unavailable(f"the {client} client's toolchain is missing")


def build_go(out_dir: Path) -> Path:
    """Build the Go client (consumer.go, allfields.go) into ``out_dir`` (temporary, never committed)."""
    require("go")
    binary = out_dir / "consumer"
    env = dict(os.environ, **GO_ENV, GOCACHE=str(out_dir / "gocache"))
    done = subprocess.run(
        ["go", "build", "-o", str(binary), "consumer.go", "allfields.go"],
        cwd=HERE / "go",
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"go build of tests/interop/go failed:\n{done.stderr}")
    return binary


def client_version(client: str) -> str:
    """The client library's version, for the client matrix of docs/reliability.md."""
    if client == "go":
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", "golang-github-rabbitmq-amqp091-go-dev"],
            capture_output=True,
            text=True,
            check=False,
        )
        return f"amqp091-go {out.stdout.strip() or '?'}"
    if client == "node":
        meta = json.loads((HERE / "node/node_modules/amqplib/package.json").read_text())
        return f"amqplib {meta['version']}"
    if client == "pika":
        import pika

        return f"pika {pika.__version__}"
    out = subprocess.run(
        ["ruby", "-e", 'require "bunny"; print Bunny::VERSION'],
        capture_output=True,
        text=True,
        check=False,
    )
    return f"bunny {out.stdout.strip() or '?'}"


def consumer_command(client: str, go_binary: Path | None, queue: str) -> list[str]:
    url = amqp_url()
    if client == "go":
        assert go_binary is not None
        return [str(go_binary), "consume", url, queue]
    if client == "node":
        return ["node", str(HERE / "node/consumer.js"), url, queue]
    return ["ruby", str(HERE / "ruby/consumer.rb"), url, queue]


def all_types_command(client: str, go_binary: Path | None, mode: str, *args: str) -> list[str]:
    """A command of the all-types programs: ``publish-all <omit|-> <queue>...``,
    ``consume-typed <queue>...`` (every client), ``publish-hostile <queue>`` (Go)."""
    url = amqp_url()
    if client == "go":
        assert go_binary is not None
        return [str(go_binary), mode, url, *args]
    program = {
        "node": ["node", str(HERE / "node/allfields.js")],
        "ruby": ["ruby", str(HERE / "ruby/allfields.rb")],
        "pika": [sys.executable, str(HERE / "pika/allfields.py")],
    }[client]
    return [*program, mode, url, *args]


@dataclass
class Consumer:
    """A running foreign consumer; its delivery log is read as it grows."""

    client: str
    proc: subprocess.Popen[str]
    log: Path
    errors: Path
    deliveries: list[dict[str, Any]] = field(default_factory=list)
    ready: bool = False
    _read: int = 0

    def poll(self) -> list[dict[str, Any]]:
        """Read the delivery lines written since the last poll."""
        text = self.log.read_text(encoding="utf-8", errors="replace")
        complete = text[: text.rfind("\n") + 1]
        for line in complete[self._read :].splitlines():
            if not line.strip():
                continue
            doc = json.loads(line)
            if doc.get("ready"):
                self.ready = True
            else:
                self.deliveries.append(doc)
        self._read = len(complete)
        return self.deliveries

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr(self) -> str:
        return self.errors.read_text(encoding="utf-8", errors="replace")


@contextlib.contextmanager
def consuming(client: str, command: list[str], workdir: Path) -> Iterator[Consumer]:
    """Run a foreign consumer until the block ends (then kill it)."""
    log, errors = workdir / f"{client}.jsonl", workdir / f"{client}.err"
    with log.open("w") as out, errors.open("w") as err:
        proc = subprocess.Popen(command, stdout=out, stderr=err, text=True, cwd=workdir)
    consumer = Consumer(client, proc, log, errors)
    try:
        deadline = time.monotonic() + 60
        while not consumer.ready:
            consumer.poll()
            if not consumer.alive() or time.monotonic() > deadline:
                pytest.fail(f"the {client} consumer did not start: {consumer.stderr()}")
            time.sleep(0.05)
        yield consumer
    finally:
        if consumer.alive():
            proc.kill()
        proc.wait(30)
