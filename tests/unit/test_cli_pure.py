"""Pure parts of the ``celery dlx`` commands: parsing, rendering, policy and rename plans, check
classification, management URLs, canary watching (a recording fake Redis), usage errors."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from kombu import Connection

from celery_dlx.broker.management import dead_letter_exchange_of, management_for
from celery_dlx.cli.main import dlx
from celery_dlx.docs_url import doc_url
from celery_dlx.errors import DLXError
from celery_dlx.message.obituary import Obituary
from celery_dlx.ops import checks
from celery_dlx.ops.canary import CanaryResult, ReplayRun, watch_canary
from celery_dlx.ops.migrate import MigrationError, effective_policy, plan_policy, plan_rename
from celery_dlx.ops.render import ago, human_seconds, iso, parse_duration, parse_when, table
from celery_dlx.ops.replay import ReplayReport
from tests.cli_runner import cli_runner


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("15m", 900),
        ("2h", 7200),
        ("3d", 259200),
        ("1w", 604800),
        ("1h30m", 5400),
        ("250ms", 0.25),
        ("1.5h", 5400),
        (" 2 h ", 7200),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5 minutes", "1h30", "-5m", "m"])
def test_parse_duration_refuses_with_the_option_named(text: str) -> None:
    with pytest.raises(DLXError, match="--for"):
        parse_duration(text, "--for")


def test_parse_when_forms() -> None:
    now = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
    assert parse_when("2h", now=now) == now - timedelta(hours=2)
    assert parse_when("2024-05-01T10:00", now=now) == datetime(2024, 5, 1, 10, tzinfo=timezone.utc)
    assert parse_when("2024-05-01T10:00+02:00", now=now).hour == 10
    assert parse_when("@1714564800", now=now) == datetime(2024, 5, 1, 12, tzinfo=timezone.utc)
    for bad in ("yesterday", "@soon", "@1e300"):
        with pytest.raises(DLXError, match="--since"):
            parse_when(bad, now=now)
    # found by the console's fuzz test: a duration past year 1 was an OverflowError (a 500)
    with pytest.raises(DLXError, match="--since: '999999999999999999999999999999' is too long ago"):
        parse_when("999999999999999999999999999999", now=now)


def test_times_and_ages() -> None:
    assert iso(1714564800123) == "2024-05-01T12:00:00.123Z" and iso(None) is None
    assert [human_seconds(s) for s in (0.25, 42, 312, 11100, 187200)] == [
        "250ms",
        "42s",
        "5m12s",
        "3h05m",
        "2d04h",
    ]
    assert (
        ago(1000, 61000) == "1m00s ago" and ago(61000, 1000) == "in 1m00s" and ago(None, 0) == "-"
    )


def test_table_cuts_the_shrinkable_columns_to_fit() -> None:
    rows = [("a", "x" * 50, "keep"), ("bb", "short", "keep")]
    text = table(("ID", "WIDE", "LAST"), rows, width=30, shrink=("WIDE",))
    lines = text.splitlines()
    assert all(len(line) <= 30 for line in lines)
    assert lines[1].split()[1].endswith("…") and lines[2].split() == ["bb", "short", "keep"]
    assert table(("A",), [(None,)], width=80).splitlines()[1] == "-"


POLICY_LIMITS = {
    "name": "limits",
    "pattern": "^billing",
    "apply-to": "queues",
    "priority": 5,
    "definition": {"max-length": 1000},
}


def test_effective_policy_is_the_highest_priority_match() -> None:
    other = {"name": "ha", "pattern": ".*", "apply-to": "all", "priority": 7, "definition": {}}
    exchanges = {"name": "x", "pattern": ".*", "apply-to": "exchanges", "priority": 99}
    own = {"name": "celery-dlx-billing", "pattern": "^billing$", "priority": 100}
    assert effective_policy("billing", [POLICY_LIMITS, exchanges, own]) == POLICY_LIMITS
    assert effective_policy("billing", [POLICY_LIMITS, other]) == other
    assert effective_policy("audit", [POLICY_LIMITS]) is None


def test_plan_policy_merges_the_policy_in_effect() -> None:
    plan = plan_policy({"name": "billing", "arguments": {}}, "celery_dlx", [POLICY_LIMITS])
    assert plan.name == "celery-dlx-billing" and plan.pattern == "^billing$"
    assert plan.definition == {
        "max-length": 1000,
        "dead-letter-exchange": "celery_dlx",
        "dead-letter-routing-key": "billing",
    }
    assert plan.priority == 6 and plan.merged_from == "limits" and plan.needed
    assert plan_policy({"name": "a.b"}, "x", []).pattern == "^a\\.b$"


def test_plan_policy_refuses_another_exchange_and_skips_arguments() -> None:
    with pytest.raises(MigrationError, match="by argument"):
        plan_policy({"name": "q", "arguments": {"x-dead-letter-exchange": "theirs"}}, "ours", [])
    theirs = {**POLICY_LIMITS, "definition": {"dead-letter-exchange": "theirs"}}
    with pytest.raises(MigrationError, match="theirs"):
        plan_policy({"name": "billing"}, "ours", [theirs])
    same = plan_policy({"name": "q", "arguments": {"x-dead-letter-exchange": "ours"}}, "ours", [])
    assert same.needed is False and "arguments" in same.reason


def test_plan_rename() -> None:
    info = {
        "name": "old",
        "arguments": {"x-max-priority": 5, "x-dead-letter-exchange": "gone"},
        "durable": True,
        "type": "quorum",
    }
    bindings = [
        {"source": "", "routing_key": "old", "destination_type": "queue"},
        {
            "source": "orders",
            "routing_key": "created",
            "arguments": {},
            "destination_type": "queue",
        },
    ]
    plan = plan_rename(info, bindings, new_queue="old.dlx", exchange="dlx", delivery_limit=3)
    assert plan.arguments == {
        "x-max-priority": 5,
        "x-dead-letter-exchange": "dlx",
        "x-dead-letter-routing-key": "old.dlx",
        "x-queue-type": "quorum",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        "x-delivery-limit": 3,
    }
    assert (
        plan.bind
        == plan.unbind
        == [{"source": "orders", "routing_key": "created", "arguments": {}}]
    )
    kept = plan_rename(info, bindings, new_queue="n", exchange="dlx", unbind_old=False)
    assert kept.unbind == []
    with pytest.raises(MigrationError, match="--to"):
        plan_rename(info, [], new_queue="old", exchange="dlx")


def test_dead_letter_exchange_of() -> None:
    assert dead_letter_exchange_of({"arguments": {"x-dead-letter-exchange": "a"}}) == (
        "a",
        "argument",
    )
    policy = {
        "arguments": {},
        "policy": "p",
        "effective_policy_definition": {"dead-letter-exchange": "b"},
    }
    assert dead_letter_exchange_of(policy) == ("b", "policy")
    operator = {**policy, "policy": None}
    assert dead_letter_exchange_of(operator) == ("b", "operator-policy")
    assert dead_letter_exchange_of({"effective_policy_definition": []}) == (None, "none")


def test_management_defaults_come_from_the_broker_url() -> None:
    api = management_for(Connection("amqp://bob:secret@mq.internal:5672/shop"))
    assert (api.url, api.user, api.password, api.vhost) == (
        "http://mq.internal:15672",
        "bob",
        "secret",
        "shop",
    )
    tls = management_for(Connection("amqps://mq:5671//", ssl=True), user="admin")
    assert tls.url == "https://mq:15671" and tls.user == "admin" and tls.vhost == "/"
    given = management_for(Connection("amqp://localhost//"), url="http://x:1", password="p")
    assert given.url == "http://x:1" and given.password == "p"


def test_classify_queue() -> None:
    assert checks.classify_queue("q", None, "dlx", "why")[0].kind == checks.MISSING_QUEUE
    assert checks.classify_queue("q", {"arguments": {}}, "dlx", "why")[0].kind == checks.NO_DLX
    wrong = {"arguments": {"x-dead-letter-exchange": "other"}}
    assert checks.classify_queue("q", wrong, "dlx", "why")[0].kind == checks.WRONG_DLX
    right = {
        "arguments": {},
        "policy": "p",
        "effective_policy_definition": {"dead-letter-exchange": "dlx"},
    }
    assert checks.classify_queue("q", right, "dlx", "why") == []


def test_find_orphans_uses_the_earliest_evidence() -> None:
    now = 10_000_000
    queues = [
        {"name": "idle", "consumers": 0, "messages_ready": 3, "idle_since": iso(now - 3_600_000)},
        {"name": "busy", "consumers": 0, "messages_ready": 9},  # published to: no idle_since
        {"name": "fresh", "consumers": 0, "messages_ready": 1, "idle_since": iso(now - 1000)},
        {"name": "consumed", "consumers": 2, "messages_ready": 50, "idle_since": iso(0)},
        {"name": "empty", "consumers": 0, "messages_ready": 0, "idle_since": iso(0)},
    ]
    found = checks.find_orphans(
        queues, for_seconds=600, now=now, first_seen={"busy": now - 700_000, "fresh": now - 5}
    )
    assert [p.subject for p in found] == ["idle", "busy"]
    assert "60 min" in found[0].detail and "--for 600s" in found[0].detail


def test_expected_queues() -> None:
    app = Celery("t", set_as_current=False)
    app.conf.update(task_default_queue="work", dlx_queues={"foreign": {}})

    class Config:
        enabled = True
        queues = {"foreign": {}}

    assert checks.expected_queues(app, Config) == {
        "work": "an app queue (dlx_enabled)",
        "foreign": "named in dlx_queues",
    }
    Config.enabled = False
    assert checks.expected_queues(app, Config) == {"foreign": "named in dlx_queues"}


class FakeRedis:
    """Replies to XREAD with the given batches, one per call, then nothing."""

    def __init__(self, batches: list[list[tuple[bytes, dict[bytes, bytes]]]]) -> None:
        self.batches = batches
        self.reads: list[tuple[dict[str, str], int]] = []

    def xread(self, streams: dict[str, str], count: int, block: int) -> Any:
        self.reads.append((dict(streams), block))
        return [(b"history", self.batches.pop(0))] if self.batches else []


class FakeRuntime:
    """The composition root's history role over a fake Redis."""

    def __init__(self, redis: FakeRedis) -> None:
        from celery_dlx.store.history import History

        class Keys:
            history = "history"

        self.history = History(redis, Keys)  # type: ignore[arg-type]


def entry(i: int, message_id: str, fate: str) -> tuple[bytes, dict[bytes, bytes]]:
    return (f"{i}-0".encode(), {b"message_id": message_id.encode(), b"fate": fate.encode()})


def obituary(origin: str = "celery") -> Obituary:
    return Obituary.from_fields(
        id="ob", message_id="m", queue="q", reason="r", buried_ms=0, origin=origin
    )


@pytest.mark.parametrize(
    ("fate", "outcome"),
    [
        ("recovered", "recovered"),
        ("requeued", "failed"),
        ("buried", "failed"),
        ("parked", "failed"),
    ],
)
def test_watch_canary_reads_the_messages_fate(fate: str, outcome: str) -> None:
    redis = FakeRedis(
        [[entry(1, "other", "recovered"), entry(2, "m", "replayed")], [entry(3, "m", fate)]]
    )
    result = watch_canary(FakeRuntime(redis), obituary(), "0-5", timeout=60)
    assert (result.outcome, result.fate) == (outcome, fate)
    assert result.succeeded is (outcome == "recovered")
    assert [streams["history"] for streams, _ in redis.reads] == ["0-5", "2-0"]


def test_watch_canary_times_out() -> None:
    ticks = iter([0.0, 0.0, 5.0, 11.0, 11.0])
    result = watch_canary(
        FakeRuntime(FakeRedis([])), obituary(), "0-0", timeout=10, clock=lambda: next(ticks)
    )
    assert (
        result.outcome == "timeout" and not result.succeeded and "--canary-timeout" in result.detail
    )


def test_replay_run_json_and_completeness() -> None:
    report = ReplayReport(replayed=["a"], skipped=[("b", "why")], failed=[], missing=[])
    run = ReplayRun(
        targets=3,
        report=report,
        canary=CanaryResult("a", "m", "q", "failed", "requeued"),
        stopped=True,
        not_replayed=["c"],
    )
    data = run.to_json()
    assert data["skipped"] == [{"id": "b", "reason": "why"}] and data["not_replayed"] == ["c"]
    assert data["canary"]["succeeded"] is False and not run.complete
    assert ReplayRun(targets=1, report=ReplayReport(replayed=["a"])).complete


def invoke(*args: str) -> Any:
    app = Celery("t", set_as_current=False)
    obj = CLIContext(app=app, no_color=True, workdir=None)
    return cli_runner().invoke(dlx, list(args), obj=obj)


def test_usage_errors_exit_2_before_touching_a_service() -> None:
    for args, text in (
        (["migrate", "q"], f"--policy or --rename ({doc_url('migration')} compares them)"),
        (["list", "--since", "later"], "--since"),
        (["check", "--for", "soon"], "--for"),
        (["replay", "--rate", "0", "x"], "--rate"),
        (["stats", "--window", "forever"], "--window"),
        (["replay"], "--all"),
        (["purge", "--yes"], "--all"),
        (["migrate", "q", "--rename", "--remove"], "--remove goes with --policy"),
        (["export", "--out", "x", "--trim", "--snapshot", __file__], "--trim"),
    ):
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert text in result.stderr


def test_every_command_is_registered_with_help() -> None:
    names = {
        "service",
        "list",
        "show",
        "groups",
        "replay",
        "edit",
        "purge",
        "parked",
        "stats",
        "check",
        "migrate",
        "migrate-keys",
        "export",
        "overflow",
        "web",
        "breakers",
    }
    assert set(dlx.commands) == names
    for name in names:
        result = invoke(name, "--help")
        assert result.exit_code == 0 and "Usage:" in result.stdout
    for name in (
        "list",
        "show",
        "groups",
        "parked",
        "stats",
        "check",
        "replay",
        "purge",
        "migrate",
    ):
        assert "--json" in invoke(name, "--help").stdout


def test_the_console_without_the_web_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail as a missing package does.
    monkeypatch.setitem(sys.modules, "celery_dlx_console.command", None)
    result = invoke("web")
    assert result.exit_code == 1
    assert "the console needs the web extra: pip install 'celery-dlx[web]'" in result.stderr


def test_replay_without_targets_is_refused_clearly() -> None:
    result = invoke("replay", "--json")
    # a usage error: exit 2, as the command line page and celery_dlx.cli.kit say
    assert result.exit_code == 2 and "--all" in result.stderr
    assert result.stdout == ""


def test_export_prints_the_spark_submit_command_from_the_app_settings() -> None:
    pytest.importorskip("pyspark", reason="spark-submit comes with the spark extra")
    app = Celery("t", set_as_current=False)
    app.conf.update(dlx_redis_url="redis://10.1.2.3:6380/4", dlx_key_prefix="shop")
    obj = CLIContext(app=app, no_color=True, workdir=None)
    args = ["export", "--out", "/data/dlx", "--trim", "--print-command", "--json"]
    result = cli_runner().invoke(dlx, args, obj=obj)
    assert result.exit_code == 0, result.output
    command = json.loads(result.stdout)
    assert (
        command[0].endswith("spark-submit") and command[command.index("--master") + 1] == "local[*]"
    )
    tail = command[command.index("--out") :]
    assert tail[:2] == ["--out", "/data/dlx"] and "--trim" in tail
    assert tail[tail.index("--redis-url") + 1] == "redis://10.1.2.3:6380/4"
    assert tail[tail.index("--prefix") + 1] == "shop"


def test_progress_bar_only_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    from celery_dlx.cli.kit import progress_bar, show_progress

    assert show_progress(as_json=True) is False
    with progress_bar(5, "replaying", enabled=False) as advance:
        advance(5)
    assert capsys.readouterr().err == ""
    with progress_bar(5, "replaying", enabled=True) as advance:
        advance(5)
    assert "replaying" in capsys.readouterr().err


def test_celery_dlx_without_an_app_is_refused_instead_of_checking_celerys_default_app() -> None:
    from celery.bin.celery import celery

    result = cli_runner(env={"APP": None}).invoke(celery, ["dlx", "check", "--no-management"])
    said = result.output + result.stderr  # click 8.1 keeps stderr apart, 8.2 has both in output
    assert result.exit_code == 2, said
    assert "name the Celery app: `celery -A proj dlx ...`" in said


def test_migrate_policy_dry_run_says_where_dead_letters_would_go() -> None:
    from celery_dlx.cli.broker import _migrate_text

    data: dict[str, Any] = {
        "queue": "orders",
        "method": "policy",
        "dry_run": True,
        "dead_letter_exchange": None,  # nothing was written: the broker has none yet
        "set_by": "none",
        "policy": {
            "needed": True,
            "name": "celery-dlx-orders",
            "priority": 1,
            "merged_from": None,
            "definition": {"dead-letter-exchange": "celery_dlx"},
        },
    }
    text = _migrate_text(data)
    assert text.startswith("dry run: policy celery-dlx-orders (priority 1) on orders")
    assert text.endswith("dead letters would go to celery_dlx (by policy)")
    assert "(set by none)" not in text
    done = _migrate_text(
        {**data, "dry_run": False, "dead_letter_exchange": "celery_dlx", "set_by": "policy"}
    )
    assert done.endswith("dead letters now go to celery_dlx (set by policy)")


def test_counts_are_singular_for_one() -> None:
    from celery_dlx.ops.render import count

    assert [count(n, "cause") for n in (0, 1, 2)] == ["0 causes", "1 cause", "2 causes"]
    assert count(1, "obituary", "obituaries") == "1 obituary"
    assert count(3, "entry", "entries") == "3 entries"
