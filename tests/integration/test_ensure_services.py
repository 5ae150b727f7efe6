"""scripts/ensure-services.sh with both services stopped, against fake servers on free ports.

The shared RabbitMQ and Redis are never touched: the script's ports are moved to free ones
(``DLX_*_PORT``) and ``redis-server``, ``rabbitmq-server``, ``rabbitmqctl``, ``rabbitmq-plugins``
and ``java`` are fakes on ``PATH``. The fake ``rabbitmqctl await_startup`` exits 69 ("node not
running at all") twice, as a real node started with ``-detached`` does until it registered, then
starts listening: the script must keep asking until its deadline instead of failing at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "ensure-services.sh"

LISTEN = (
    'python3 -c "import socket,sys\n'
    "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(16)\n"
    'while True: s.accept()" "$1" >/dev/null 2>&1 &\n'
    'echo $! >> "$FAKE_DIR/pids"\n'
)
FAKES = {
    "listen": "#!/usr/bin/env bash\n" + LISTEN,
    "redis-server": (
        "#!/usr/bin/env bash\n"
        'echo "redis-server $*" >> "$FAKE_DIR/calls"\n'
        'while [ "$#" -gt 0 ]; do [ "$1" = --port ] && port="$2"; shift; done\n'
        '"$FAKE_DIR/bin/listen" "$port"\n'
    ),
    "rabbitmq-server": '#!/usr/bin/env bash\necho "rabbitmq-server $*" >> "$FAKE_DIR/calls"\n',
    "rabbitmqctl": (
        "#!/usr/bin/env bash\n"
        'echo "rabbitmqctl $*" >> "$FAKE_DIR/calls"\n'
        'n=$(( $(cat "$FAKE_DIR/ctl" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$FAKE_DIR/ctl"\n'
        'if [ "$n" -le "${FAKE_NOT_RUNNING:-2}" ]; then\n'
        "  echo \"Error: unable to perform an operation on node 'rabbit@x'\" >&2; exit 69\n"
        "fi\n"
        '[ -e "$FAKE_DIR/amqp" ] || { touch "$FAKE_DIR/amqp"; "$FAKE_DIR/bin/listen" "$DLX_AMQP_PORT"; }\n'
    ),
    "rabbitmq-plugins": (
        '#!/usr/bin/env bash\necho "rabbitmq-plugins $*" >> "$FAKE_DIR/calls"\n'
        '"$FAKE_DIR/bin/listen" "$DLX_MANAGEMENT_PORT"\n'
    ),
    "java": "#!/usr/bin/env bash\necho 'openjdk version \"17.0.9\" 2023-10-17' >&2\n",
    "apt-get": '#!/usr/bin/env bash\necho "apt-get $*" >> "$FAKE_DIR/calls"; exit 1\n',
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[dict[str, str]]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in FAKES.items():
        path = bindir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    env = {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "FAKE_DIR": str(tmp_path),
        "DLX_REDIS_PORT": str(_free_port()),
        "DLX_AMQP_PORT": str(_free_port()),
        "DLX_MANAGEMENT_PORT": str(_free_port()),
    }
    yield env
    pids = tmp_path / "pids"
    for pid in pids.read_text().split() if pids.exists() else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGTERM)  # the fake listeners this test started


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120
    )


def test_waits_for_a_starting_rabbitmq_node_until_it_answers(fake: dict[str, str]) -> None:
    result = _run(fake)
    assert result.returncode == 0, result.stdout + result.stderr
    calls = (Path(fake["FAKE_DIR"]) / "calls").read_text().splitlines()
    assert any(
        c.startswith("redis-server --daemonize yes") and fake["DLX_REDIS_PORT"] in c for c in calls
    )
    assert "rabbitmq-server -detached" in calls
    waits = [c for c in calls if c.startswith("rabbitmqctl await_startup")]
    # exits 69 twice, then 0 (the port may need one more turn to answer): it kept asking
    assert len(waits) >= 3, waits
    assert any(c.startswith("rabbitmq-plugins enable") for c in calls)
    assert not any(c.startswith("apt-get") for c in calls), "nothing to install"
    assert "starting redis-server" in result.stdout and "starting rabbitmq-server" in result.stdout


def test_gives_up_at_the_deadline_with_a_clear_error(fake: dict[str, str]) -> None:
    result = _run({**fake, "FAKE_NOT_RUNNING": "1000", "DLX_RABBITMQ_WAIT": "3"})
    assert result.returncode == 1
    assert "RabbitMQ did not start within 3s (rabbitmqctl await_startup: exit 69)" in result.stderr


def test_running_services_are_left_alone(fake: dict[str, str]) -> None:
    assert _run(fake).returncode == 0
    calls = Path(fake["FAKE_DIR"]) / "calls"
    calls.unlink()
    again = _run(fake)  # everything answers now: nothing is started or installed
    assert again.returncode == 0, again.stderr
    assert not calls.exists(), calls.read_text()
