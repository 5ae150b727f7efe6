"""The console behind any name, safe against rebinding, on a real uvicorn server: a foreign
``Host`` (a DNS-rebinding page) gets 400 before anything else, a write whose ``Origin`` (or
``Referer``) is not the console's gets 403, and a name of ``dlx_web_allowed_hosts`` works."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from celery_dlx_console.server import Background
from tests.conftest import ROOT
from tests.web.conftest import serve
from tests.web.helpers import OPERATOR, Client, bury, task_obituary


def _graveyard(console: dict[str, Any], n: int = 3) -> list[str]:
    obits = [task_obituary(console["app"], console["task"].name, i) for i in range(n)]
    bury(console["runtime"], obits)
    return [ob.id for ob in obits]


def _untouched(server: Background, runtime: Any, ids: list[str]) -> None:
    """Every obituary is still there, none replayed, and no action was audited."""
    listed = Client(server.url, OPERATOR).get("/api/obituaries").json()
    assert sorted(r["id"] for r in listed["obituaries"]) == sorted(ids)
    assert all(not r["replays"] for r in listed["obituaries"])
    assert runtime.redis.xlen("{" + runtime.keys.prefix + "}:web:audit") == 0
    assert not [f for _, f in runtime.history.read() if f["fate"] in ("purged", "replayed")]


@pytest.fixture
def open_console(shop: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The default console: loopback, no accounts, so anyone on the machine is an operator."""
    server = serve(shop["runtime"], operators=(), viewers=())
    try:
        yield {**shop, "server": server, "url": server.url, "port": server.settings.port}
    finally:
        server.stop()


def test_a_rebinding_page_can_neither_read_nor_write(open_console: dict[str, Any]) -> None:
    ids = _graveyard(open_console)
    port = open_console["port"]
    token = Client(open_console["url"]).csrf()  # the worst case: it even has a valid token
    for name in (f"attacker.example:{port}", "attacker.example"):
        origin = f"http://{name}"
        rebound = Client(open_console["url"], origin=origin)
        host = {"Host": name}
        csrf = rebound.get("/api/csrf", headers=host)
        assert csrf.status == 400 and "token" not in csrf.text
        assert "dlx_web_allowed_hosts" in csrf.text and "attacker.example" in csrf.text
        assert csrf.headers["content-type"].startswith("text/plain")
        assert csrf.headers["x-content-type-options"] == "nosniff"
        writes = [
            rebound.post(
                "/api/purge",
                json_body={"ids": ids, "yes": True},
                headers={**host, "X-CSRF-Token": token},
            ),
            rebound.post(
                "/api/replay",
                json_body={"ids": ids, "rate": 5},
                headers={**host, "X-CSRF-Token": token},
            ),
            rebound.post(
                "/actions/purge",
                form=[("csrf", token), *(("ids", i) for i in ids), ("confirm", "purge 3")],
                headers=host,
            ),
            rebound.post("/actions/replay", form=[("csrf", token), ("ids", ids[0])], headers=host),
        ]
        for reply in writes:
            assert reply.status == 400 and "dlx_web_allowed_hosts" in reply.text, reply.text
        assert rebound.get("/", headers=host).status == 400
    _untouched(open_console["server"], open_console["runtime"], ids)


def test_a_foreign_host_is_refused_before_credentials_are_asked(console: dict[str, Any]) -> None:
    reply = console["nobody"].get("/", headers={"Host": "attacker.example"})
    assert reply.status == 400 and "www-authenticate" not in reply.headers


def test_a_write_from_another_origin_or_from_nowhere_is_refused(console: dict[str, Any]) -> None:
    ids = _graveyard(console)
    url, token = console["url"], console["op"].csrf()
    foreign = [
        {"Origin": "http://attacker.example"},
        {"Origin": url.replace("127.0.0.1", "localhost")},  # another origin of the same machine
        {"Origin": url.replace("http:", "https:")},
        {"Origin": "null"},  # a sandboxed frame, or a page with no-referrer
        {"Referer": "http://attacker.example/page"},
        {"Origin": "http://attacker.example", "Referer": url + "/causes"},  # Origin decides
    ]
    for headers in [*foreign, {}]:
        client = Client(url, OPERATOR, origin=None)
        for reply in (
            client.post(
                "/api/purge",
                json_body={"ids": ids, "yes": True},
                headers={**headers, "X-CSRF-Token": token},
            ),
            client.post(
                "/actions/purge",
                form=[("csrf", token), *(("ids", i) for i in ids), ("confirm", "purge 3")],
                headers=headers,
            ),
            client.post(
                "/api/replay",
                json_body={"ids": ids, "rate": 5},
                headers={**headers, "X-CSRF-Token": token},
            ),
        ):
            assert reply.status == 403, (headers, reply.status, reply.text)
            assert "must come from the console's own pages" in reply.text
            said = "no Origin or Referer" if not headers else "Origin/Referer"
            assert said in reply.text and f"not {url}." in reply.text
            https = headers.get("Origin", "").startswith("https:")
            hint = "X-Forwarded-Proto: https" if https else f"curl -H 'Origin: {url}'"
            assert hint in reply.text
    _untouched(console["server"], console["runtime"], ids)
    # Without Origin, a Referer of the console's own page is enough.
    referred = Client(url, OPERATOR, origin=None).post(
        "/api/purge",
        json_body={"ids": ids[:1], "yes": True},
        headers={"Referer": url + "/group?cause=backend-down", "X-CSRF-Token": token},
    )
    assert referred.status == 200 and referred.json()["purged"] == ids[:1], referred.text


def test_a_name_of_dlx_web_allowed_hosts_works(shop: dict[str, Any]) -> None:
    ids = _graveyard(shop)
    server = serve(shop["runtime"], allowed_hosts=("DLX.example.test", "*.corp.example"))
    try:
        for name in ("dlx.example.test", "console.corp.example:8443"):
            client = Client(server.url, OPERATOR, origin=f"http://{name}")
            host = {"Host": name}
            assert client.get("/causes", headers=host).status == 200
            token = client.get("/api/csrf", headers=host).json()["token"]
            purged = client.post(
                "/api/purge",
                json_body={"ids": [ids.pop()], "yes": True},
                headers={**host, "X-CSRF-Token": token},
            )
            assert purged.status == 200 and len(purged.json()["purged"]) == 1, purged.text
            # The name is trusted, but a write from another origin still is not.
            stray = Client(server.url, OPERATOR, origin="http://attacker.example").post(
                "/api/purge", json_body={"ids": ids, "yes": True}, headers={**host}
            )
            assert stray.status == 403
        assert Client(server.url).get("/", headers={"Host": "corp.example"}).status == 400
        assert Client(server.url, OPERATOR).get("/api/obituaries").json()["total"] == 1
    finally:
        server.stop()


def test_the_command_refuses_a_wildcard_for_every_host(uid: str) -> None:
    """``--allowed-host '*'`` would let a rebinding page in: the command exits with the reason."""
    env = {"DLX_CLI_UID": uid, "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from celery_dlx.cli.main import main; main()",
            "-A",
            "tests.integration.cli_app",
            "web",
            "--allowed-host",
            "dlx.example.test",
            "--allowed-host",
            "*",
            "--port",
            "5999",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "--allowed-host/dlx_web_allowed_hosts[1] is '*'" in done.stderr
