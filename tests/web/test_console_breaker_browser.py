"""Open breakers in a real browser (Playwright driving Debian's Chromium) against a real worker,
DLX service, Redis and RabbitMQ.

A dependency fails; the first failures of its cause are buried (a budget of 0), the next ones
open the cause's breaker (``dlx_breaker``, small window, long probe and hold so it stays open
while the test looks) and are held. The overview lists the breaker (queue, cause linked to its
cause page, task, exception, opened, held, next canary), next to a breaker of a hostile cause
text that stays inert text and, having no obituary, no link. The cause page shows a notice. A
viewer sees both read-only and is refused a hand-made close; an operator closes the breaker on
the cause page (CSRF token required, an audit log entry), the held messages come back and run
once the dependency is back. Screenshots go to ``$DLX_CONSOLE_SHOTS`` (``docs/console``
regenerates the documentation's)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_dlx.fates import now_ms
from celery_dlx.ops import obituaries
from celery_dlx.policy.breaker import BreakerSettings
from celery_dlx.wiring.runtime import get_runtime
from celery_dlx_console.server import Background
from tests.integration.dlx_apps import (
    delays_returning,
    make_app,
    queue_names,
    service_thread,
    worker,
)
from tests.integration.helpers import wait_until
from tests.web.conftest import serve
from tests.web.helpers import OPERATOR, VIEWER, XSS, Client
from tests.web.test_console_browser import (  # the module's browser, shots and skip rule
    browser,
    open_as,
    pytestmark,
    shots,
)

__all__ = ["browser", "pytestmark", "shots"]

#: Opens past 2 failures in 30 s; the canary and the hold are far enough away that nothing held
#: comes back while the test looks at the pages.
BREAKER = {"failures": 2, "window": 30, "hold": 120, "probe": 60, "release_rate": 50}
#: Messages sent while the dependency is down: 2 buried, then 3 held.
SENT = 5


@pytest.fixture
def burning(
    uid: str, key_prefix: str, redis_client: Any, cleanup_queues: list[str]
) -> Iterator[dict[str, Any]]:
    """An app whose ``charge`` fails until ``up`` is set in Redis (no retry budget: a failure
    is buried unless a breaker holds it), served by a console with an operator and a viewer."""
    app = make_app(uid, dlx_breaker=BREAKER, dlx_max_requeues=0, dlx_max_parks=0)
    cleanup_queues.extend(queue_names(app))
    cleanup_queues.append(f"exchange:{app.conf.dlx_exchange}")
    runtime = get_runtime(app)
    up, done = "{" + key_prefix + "}:test:up", "{" + key_prefix + "}:test:done"

    @app.task(name=f"charge-{uid}")
    def charge(n: int) -> None:
        if not redis_client.get(up):
            raise ConnectionError("payment gateway unreachable")
        redis_client.sadd(done, n)

    server: Background = serve(runtime)
    try:
        yield {
            "app": app,
            "runtime": runtime,
            "charge": charge,
            "up": up,
            "done": done,
            "url": server.url,
        }
    finally:
        server.stop()
        runtime.reset_publisher()


def breaker_rows(page: Any) -> list[list[str]]:
    return [
        [c.strip() for c in row.inner_text().split("\t")]
        for row in page.locator("#breakers tr.breaker").all()
    ]


def test_breakers_on_the_overview_and_the_cause_page(
    browser: Any, burning: dict[str, Any], redis_client: Any, shots: Path
) -> None:
    app, runtime, url = burning["app"], burning["runtime"], burning["url"]
    queue = app.conf.task_default_queue
    with worker(app), service_thread(app):
        for n in range(SENT):
            burning["charge"].delay(n)
        wait_until(
            lambda: (
                [b.held for b in runtime.breakers.list_open()] == [SENT - 2]
                and obituaries.count(runtime) == 2
            ),
            timeout=60,
            what="2 burials, then a breaker holding the rest",
        )
        [real] = runtime.breakers.list_open()
        cause = real.cause
        assert (real.queue, real.task) == (queue, burning["charge"].name)
        operator, page, watch = open_as(browser, url, OPERATOR)
        try:
            page.goto("/")
            [row] = breaker_rows(page)
            assert row[:4] == [queue, cause, burning["charge"].name, "ConnectionError"]
            assert re.fullmatch(r"[0-9.hms]+ ago", row[4]), row
            assert row[5] == str(SENT - 2)
            assert re.fullmatch(r"in [0-9.hms]+", row[6]), row
            assert page.locator("#breakers form.close-breaker").count() == 1
            page.screenshot(path=str(shots / "overview-breakers.png"), full_page=True)
            page.click(f"#breakers a:text('{cause}')")
            assert page.inner_text("#group-count") == "2"
            notice = page.inner_text("#breaker-1")
            assert f"Breaker open on queue {queue}" in notice and f"{SENT - 2} held" in notice
            page.screenshot(path=str(shots / "cause-breaker.png"), full_page=True)

            # A breaker whose cause, task and exception are hostile text (the store takes any).
            hostile = BreakerSettings(failures=1, window=30, hold=120, probe=60)
            for i in range(2):
                runtime.breakers.fail(
                    queue, XSS, hostile, now_ms(), entry_id=f"x{i}:0", task=XSS, exc_type=XSS
                )
            viewer_reads_both_read_only(browser, url, queue, cause)
            assert len(runtime.breakers.list_open()) == 2

            # Without the CSRF token: refused, the breaker stays open.
            posted = page.request.post(
                "/actions/close-breaker",
                form={"cause": cause, "queue": queue},
                headers={"Origin": url},
            )
            assert posted.status == 403 and "CSRF" in posted.text()
            assert runtime.breakers.is_open(queue, cause)
            redis_client.set(burning["up"], "1")
            with delays_returning(app):
                page.click("#breaker-1 button[type=submit]")
                page.wait_for_url(re.compile(r"/group\?cause="))
                assert page.locator("#breaker-1").count() == 0
                wait_until(
                    lambda: redis_client.scard(burning["done"]) == SENT - 2,
                    timeout=60,
                    what="the held messages ran once released",
                )
            assert [b.cause for b in runtime.breakers.list_open()] == [XSS]
            page.goto("/audit")
            audit = page.locator("#audit tbody tr").first.inner_text()
            assert "op (operator)" in audit and "close breaker" in audit
            assert f"cause {cause} on {queue}" in audit
            assert f"closed, {SENT - 2} held messages released" in audit
            page.goto("/")
            assert [r[1] for r in breaker_rows(page)] == [XSS]
            assert page.evaluate("typeof window.__xss") == "undefined"
            assert not watch.dialogs and not watch.errors, (watch.dialogs, watch.errors)
        finally:
            operator.close()
    # Nothing of the held cause was buried: only the 2 failures before the breaker opened.
    assert obituaries.count(runtime) == 2


def viewer_reads_both_read_only(browser: Any, url: str, queue: str, cause: str) -> None:
    """A viewer sees both breakers, no Close button; the real cause is linked to its cause page,
    the hostile one (no obituary) is inert text without a link; a hand-made close is refused."""
    context, page, watch = open_as(browser, url, VIEWER)
    try:
        page.goto("/")
        by_cause = {r[1]: r for r in breaker_rows(page)}
        assert set(by_cause) == {cause, XSS}
        assert by_cause[XSS][1:4] == [XSS, XSS, XSS] and by_cause[XSS][5] == "1"
        table = page.locator("#breakers")
        assert table.locator(f"a[href='/group?cause={cause}']").count() == 1
        assert table.locator("a").count() == 1  # no link to a cause page that would be a 404
        assert page.locator("form.close-breaker").count() == 0
        assert page.evaluate("typeof window.__xss") == "undefined"
        assert page.locator("img[src=x]").count() == 0
        page.goto(f"/group?cause={cause}")
        assert "Breaker open" in page.inner_text("#breaker-1")
        assert page.locator("form.close-breaker").count() == 0
        token = Client(url, VIEWER).csrf()
        posted = page.request.post(
            "/actions/close-breaker",
            form={"csrf": token, "cause": cause, "queue": queue},
            headers={"Origin": url},
        )
        assert posted.status == 403 and "viewer" in posted.text()
        assert not watch.dialogs and not watch.errors, (watch.dialogs, watch.errors)
    finally:
        context.close()
