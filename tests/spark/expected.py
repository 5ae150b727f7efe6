"""Aggregates of ``generated.history()``, worked out by hand from its description.

Percentiles are exact with linear interpolation: for n sorted values, p sits at index p * (n - 1).
"""

from __future__ import annotations

D1 = "2024-03-04"
D2 = "2024-03-05"

#: Columns of the tuples below.
COLUMNS = (
    "exc_type",
    "failures",
    "requeues",
    "parks",
    "burials",
    "replays",
    "failed_messages",
    "recovered_messages",
    "retry_success_rate",
    "ttr_p50_s",
    "ttr_p95_s",
)

#: (day, queue, task, cause) -> COLUMNS.
DAILY = {
    # A: 40 requeues + 10 parks + 10 burials; a0..a29 recover after 1..30 s:
    # p50 at index 14.5 -> 15.5; p95 at index 27.55 -> 28 + 0.55 = 28.55.
    (D1, "orders", "shop.charge", "c-timeout"): (
        "requests.exceptions.Timeout",
        60,
        40,
        10,
        10,
        0,
        40,
        30,
        0.75,
        15.5,
        28.55,
    ),
    # B: 10 parks + 5 burials, 2 replays; b0..b4 recover after 10..50 s, b5 after 28802 s:
    # sorted 10,20,30,40,50,28802: p50 at index 2.5 -> 35; p95 at 4.75 -> 50 + 0.75 * 28752.
    (D1, "orders", "shop.charge", "c-db"): (
        "psycopg2.OperationalError",
        15,
        0,
        10,
        5,
        2,
        10,
        6,
        0.6,
        35.0,
        21614.0,
    ),
    (D1, "emails", "mail.send", "c-smtp"): (
        "smtplib.SMTPServerDisconnected",
        5,
        5,
        0,
        0,
        0,
        5,
        0,
        0.0,
        None,
        None,
    ),
    # D: failed on day 1 at 23:59, recovered on day 2: counted on its failure's day.
    (D1, "orders", "shop.refund", "c-late"): (
        "TimeoutError",
        1,
        1,
        0,
        0,
        0,
        1,
        1,
        1.0,
        120.0,
        120.0,
    ),
    (D1, "legacy", "", ""): (None, 3, 0, 0, 3, 0, 3, 0, 0.0, None, None),
    # A2: recovered events without first_failure_ms fall back to the failure: 60 s and 120 s;
    # p95 at index 0.95 -> 60 + 0.95 * 60.
    (D2, "orders", "shop.charge", "c-timeout"): (
        "requests.exceptions.Timeout",
        4,
        4,
        0,
        0,
        0,
        4,
        2,
        0.5,
        90.0,
        117.0,
    ),
}

#: Summary over both days, most failures first: (queue, task, cause, failures, failed,
#: recovered, p50, p95). c-timeout: 44 messages, 32 recovered after 1..30, 60, 120 s:
#: p50 at index 15.5 -> 16.5; p95 at index 29.45 -> 30 + 0.45 * 30.
SUMMARY = [
    ("orders", "shop.charge", "c-timeout", 64, 44, 32, 16.5, 43.5),
    ("orders", "shop.charge", "c-db", 15, 10, 6, 35.0, 21614.0),
    ("emails", "mail.send", "c-smtp", 5, 5, 0, None, None),
    ("legacy", "", "", 3, 3, 0, None, None),
    ("orders", "shop.refund", "c-late", 1, 1, 1, 120.0, 120.0),
]
#: Totals: 88 failures of 63 messages, 39 of them recovered.
TOTAL_FAILURES = 88
TOTAL_FAILED = 63
TOTAL_RECOVERED = 39

#: Events per (day, queue) partition: day 1 orders = A (100) + B (35) + r0's failure.
PARTITIONS = {(D1, "orders"): 136, (D2, "orders"): 7, (D1, "emails"): 5, (D1, "legacy"): 3}

#: Top causes of orders / shop.charge on day 1: (cause, rank, share).
TOP_CAUSES_D1_CHARGE = [("c-timeout", 1, 0.8), ("c-db", 2, 0.2)]
