"""The console's gate on a real uvicorn server: 401 without credentials, viewers read but get
403 on every write route, CSRF on every POST, body size limit, security headers, refusal to
listen on a non-loopback address without credentials."""

from __future__ import annotations

import base64
import http.client
import subprocess
import sys
from typing import Any

import pytest

from celery_dlx.errors import ConfigurationError
from celery_dlx_console.auth import Accounts, check_listen, is_loopback
from celery_dlx_console.console import WebSettings
from celery_dlx_console.server import Background
from tests.conftest import ROOT
from tests.web.helpers import Client, bury, task_obituary

READ_ROUTES = [
    "/",
    "/causes",
    "/parked",
    "/audit",
    "/metrics",
    "/api/groups",
    "/api/obituaries",
    "/api/parked",
    "/api/stats",
    "/api/audit",
    "/api/csrf",
]
WRITE_ROUTES = ["/actions/replay", "/actions/purge", "/api/replay", "/api/purge"]


def test_no_or_wrong_credentials_get_401_everywhere(console: dict[str, Any]) -> None:
    wrong = Client(console["url"], ("op", "not-the-password"))
    unknown = Client(console["url"], ("mallory", "op-secret"))
    for client in (console["nobody"], wrong, unknown):
        for path in [*READ_ROUTES, "/static/console.css"]:
            reply = client.get(path)
            assert reply.status == 401, (path, reply.status)
            assert reply.headers["www-authenticate"].startswith("Basic realm=")
        for path in WRITE_ROUTES:
            assert client.post(path, form={"csrf": "x"}).status == 401
    garbage = console["nobody"].get("/", headers={"Authorization": "Basic %%%not-base64"})
    assert garbage.status == 401


def test_viewer_reads_everything_and_is_refused_every_write(console: dict[str, Any]) -> None:
    runtime, app = console["runtime"], console["app"]
    obits = [task_obituary(app, console["task"].name, i) for i in range(3)]
    bury(runtime, obits)
    viewer = console["viewer"]
    for path in READ_ROUTES:
        assert viewer.get(path).status == 200, path
    page = viewer.get("/group", params={"cause": "backend-down"})
    assert page.status == 200
    assert 'action="/actions/replay"' not in page.text and "Purge" not in page.text
    token = viewer.csrf()  # even with its own valid token
    ids = [obits[0].id]
    for path in ("/actions/replay", "/actions/purge"):
        reply = viewer.post(path, form=[("csrf", token), ("ids", ids[0]), ("confirm", "purge 1")])
        assert reply.status == 403, path
        assert "viewer" in reply.text
    for path, body in (
        ("/api/replay", {"ids": ids, "rate": 1}),
        ("/api/purge", {"ids": ids, "yes": True}),
    ):
        reply = viewer.post(path, json_body=body, headers={"X-CSRF-Token": token})
        assert reply.status == 403, path
    # Nothing was replayed or purged.
    listed = console["op"].get("/api/obituaries").json()
    assert listed["total"] == 3 and all(not r["replays"] for r in listed["obituaries"])
    assert runtime.redis.xlen("{" + runtime.keys.prefix + "}:web:audit") == 0


def test_every_post_needs_the_users_csrf_token(console: dict[str, Any]) -> None:
    runtime, app = console["runtime"], console["app"]
    ob = task_obituary(app, console["task"].name, 1)
    bury(runtime, [ob])
    op = console["op"]
    viewer_token = console["viewer"].csrf()
    for token in (None, "", "0" * 64, viewer_token):
        form = [("ids", ob.id), ("confirm", "purge 1"), ("rate", "1")]
        if token is not None:
            form.append(("csrf", token))
        for path in ("/actions/replay", "/actions/purge"):
            reply = op.post(path, form=form)
            assert reply.status == 403 and "CSRF" in reply.text, (path, token)
        headers = {} if token is None else {"X-CSRF-Token": token}
        assert (
            op.post("/api/purge", json_body={"ids": [ob.id], "yes": True}, headers=headers).status
            == 403
        )
        assert (
            op.post("/api/replay", json_body={"ids": [ob.id], "rate": 1}, headers=headers).status
            == 403
        )
    assert op.get("/api/obituaries").json()["total"] == 1
    # Write routes take POST only.
    assert op.get("/actions/purge").status == 405
    assert op.get("/api/replay").status == 405


def test_request_body_size_is_limited(console: dict[str, Any]) -> None:
    op = console["op"]
    token = op.csrf()
    big = [("csrf", token), ("confirm", "purge 1")] + [("ids", "x" * 1000)] * 100
    reply = op.post("/actions/purge", form=big)
    assert reply.status == 413
    chunked = op.post(
        "/api/purge",
        body=b"{" + b" " * (200 * 1024) + b"}",
        headers={"X-CSRF-Token": token, "Content-Type": "application/json"},
    )
    assert chunked.status == 413
    # Without Content-Length (chunked), the body is counted while it is read.
    conn = http.client.HTTPConnection(
        "127.0.0.1", int(console["url"].rsplit(":", 1)[1]), timeout=60
    )
    auth = base64.b64encode(b"op:op-secret").decode()
    conn.request(
        "POST",
        "/api/purge",
        body=iter([b"{" + b" " * 16384] * 8 + [b"}"]),
        headers={"Authorization": f"Basic {auth}", "X-CSRF-Token": token, "Origin": console["url"]},
        encode_chunked=True,
    )
    reply_status = conn.getresponse().status
    conn.close()
    assert reply_status == 413
    conn = http.client.HTTPConnection(
        "127.0.0.1", int(console["url"].rsplit(":", 1)[1]), timeout=60
    )
    conn.request(
        "POST",
        "/api/purge",
        body=iter([b'{"ids": [], ', b'"yes": true}']),
        headers={"Authorization": f"Basic {auth}", "X-CSRF-Token": token, "Origin": console["url"]},
        encode_chunked=True,
    )
    small = conn.getresponse()
    assert small.status == 400 and b"choose obituaries" in small.read()  # read whole, judged
    conn.close()
    assert op.get("/api/groups").status == 200  # the server is fine


def test_security_headers_and_csp_forbid_inline_script(console: dict[str, Any]) -> None:
    for path in ("/", "/causes", "/api/groups", "/nope"):
        reply = console["op"].get(path)
        csp = reply.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert reply.headers["x-content-type-options"] == "nosniff"
        assert reply.headers["x-frame-options"] == "DENY"
        # Not no-referrer, under which Chromium's own form posts carry Origin: null.
        assert reply.headers["referrer-policy"] == "same-origin"
    page = console["op"].get("/causes").text
    assert "<script>" not in page and 'src="/static/console.js"' in page
    assert console["nobody"].get("/").headers["content-security-policy"]


def test_loopback_rule() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert (
        not is_loopback("0.0.0.0")
        and not is_loopback("10.1.2.3")
        and not is_loopback("example.com")
    )
    open_accounts = Accounts.from_lists([], [])
    check_listen("127.0.0.1", open_accounts)
    with pytest.raises(
        ConfigurationError, match=r"refusing to listen on '0\.0\.0\.0' without credentials"
    ):
        check_listen("0.0.0.0", open_accounts)
    check_listen("0.0.0.0", Accounts.from_lists([], ["v:pw"]))
    with pytest.raises(ConfigurationError, match="USER:PASSWORD"):
        Accounts.from_lists(["nopassword"], [])
    with pytest.raises(ConfigurationError, match="given twice"):
        Accounts.from_lists(["a:1"], ["a:2"])


def test_server_refuses_open_non_loopback(shop: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="without credentials"):
        Background(shop["runtime"], WebSettings(host="0.0.0.0", port=1))


def test_command_refuses_open_non_loopback(uid: str) -> None:
    """``celery-dlx -A app web --host 0.0.0.0`` without credentials exits with the reason."""
    env = {"DLX_CLI_UID": uid, "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from celery_dlx.cli.main import main; main()",
            "-A",
            "tests.integration.cli_app",
            "web",
            "--host",
            "0.0.0.0",
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
    assert "refusing to listen on '0.0.0.0' without credentials" in done.stderr
    assert "--basic-auth USER:PASSWORD" in done.stderr


def test_open_console_on_loopback_lets_the_local_user_operate(shop: dict[str, Any]) -> None:
    from tests.web.conftest import serve

    server = serve(shop["runtime"], operators=(), viewers=())
    try:
        client = Client(server.url)
        assert client.get("/causes").status == 200
        assert "anonymous · operator" in client.get("/").text
    finally:
        server.stop()
