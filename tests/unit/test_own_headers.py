"""celery_dlx's own headers (``OWN_HEADERS``): a replay drops them, the breaker's hold headers
too, and keeps them all with ``--keep-attempts``."""

from __future__ import annotations

from celery_dlx.message.names import (
    ATTEMPT_HEADER,
    HELD_HEADER,
    HOLDS_HEADER,
    OWN_HEADERS,
    REPLAYED_HEADER,
)
from celery_dlx.message.obituary import Obituary
from celery_dlx.ops.replay import replay_copy
from celery_dlx.policy import breaker


def held_obituary() -> Obituary:
    """A message buried after a breaker had held it twice (its copies carry the hold headers)."""
    return Obituary.from_fields(
        id="ob-held",
        message_id="m-held",
        queue="payments",
        reason="retry budget spent",
        buried_ms=1_000,
        origin="celery",
        headers={ATTEMPT_HEADER: 3, HELD_HEADER: "cafe01", HOLDS_HEADER: 2, "x-tenant": "acme"},
        payload=b"{}",
        payload_size=2,
    )


def test_the_hold_headers_are_celery_dlx_headers() -> None:
    assert {HELD_HEADER, HOLDS_HEADER} <= OWN_HEADERS
    assert all(h.startswith("x-dlx-") for h in OWN_HEADERS)
    # the worker and the policy name the very same headers
    assert (breaker.HELD_HEADER, breaker.HOLDS_HEADER) == (HELD_HEADER, HOLDS_HEADER)


def test_a_replay_is_no_canary_of_a_breaker() -> None:
    """A replayed copy carrying ``x-dlx-held`` would close that cause's breaker when it
    succeeds, as if it were the breaker's canary: a replay drops it."""
    fresh = replay_copy(held_obituary())
    assert fresh.headers == {"x-tenant": "acme", REPLAYED_HEADER: "ob-held"}


def test_keep_attempts_keeps_every_own_header() -> None:
    kept = replay_copy(held_obituary(), keep_attempts=True)
    assert (kept.headers[HELD_HEADER], kept.headers[HOLDS_HEADER]) == ("cafe01", 2)
    assert kept.headers[ATTEMPT_HEADER] == 3
