#!/usr/bin/env python
"""Compatibility gate: Celery's own integration suite, plain and with celery_dlx on.

Fetches ``t/integration`` from the sdist of the INSTALLED Celery version (cached under
``.cache/celery-compat/``), runs the chosen files twice against the real services (broker
RabbitMQ in a fresh vhost per run, result backend Redis under a unique key prefix), once plain
and once with ``tests/compat/plugin.py`` switching celery_dlx on for the suite's apps, and
compares per-test outcomes (the decisions are ``tests/compat/gate.py``'s). A test that passes
plain and fails with celery_dlx on is:

- an allowed difference when ``tests/compat/allowed.toml`` lists it AND it failed as written
  there (exception type, message pattern);
- otherwise run again alone, ``--reruns`` times in each mode (its own pytest session each time,
  plain and celery_dlx on in turn): flaky if it fails plain too with the same exception type,
  else a regression. A failure seen only with celery_dlx on fails the gate even when every
  rerun passed.

The drain of a celery_dlx run is the session worker's own drainer bootstep: the plugin reports
whether it ran, the failure history of the run's key prefix counts the parked and drained
retries, and parked retries that none drained fail the gate.

Usage::

    python scripts/celery_compat.py                       # test_tasks.py test_group_chains.py
    python scripts/celery_compat.py test_canvas.py test_inspect.py
    python scripts/celery_compat.py --budgets 0 test_tasks.py   # burial = Celery's failure

Exit status: 0 when no regression and the drain worked, 1 otherwise (a run that hangs past
``--suite-timeout`` is killed and counts as a failure), 2 on a set-up error.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import tomllib

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python scripts/celery_compat.py`
    sys.path.insert(0, str(ROOT))

from tests.compat import gate  # noqa: E402  (the gate's decisions, pure and tested)

CACHE = ROOT / ".cache" / "celery-compat"
ALLOWED = ROOT / "tests" / "compat" / "allowed.toml"
DEFAULT_FILES = ("test_tasks.py", "test_group_chains.py")
#: Times a differing test is run again alone in each mode before the gate decides.
DEFAULT_RERUNS = 3

AMQP_HOST = os.environ.get("CELERY_DLX_COMPAT_AMQP_HOST", "127.0.0.1")
MANAGEMENT = os.environ.get("CELERY_DLX_COMPAT_MANAGEMENT", "http://127.0.0.1:15672")
REDIS_URL = os.environ.get("CELERY_DLX_COMPAT_REDIS", "redis://127.0.0.1:6379/0")


def celery_version() -> str:
    import celery

    return str(celery.__version__)


def fetch_suite(version: str) -> Path:
    """``t/`` and the pytest settings of Celery ``version``'s sdist, downloaded once."""
    base = CACHE / f"celery-{version}"
    marker = base / ".extracted"  # written last: an interrupted extraction is done again
    if marker.exists():
        return base
    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = CACHE / f"celery-{version}.tar.gz"
    if not sdist.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-binary",
                ":all:",
                "--no-deps",
                f"celery=={version}",
                "-d",
                str(CACHE),
            ],
            check=True,
        )
    prefix = f"celery-{version}/"
    with tarfile.open(sdist) as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.name.startswith(prefix + "t/integration/")
            # t/'s own helper modules (t/canvas_helpers.py...), not t/unit or t/smoke
            or (m.name.startswith(prefix + "t/") and m.name.count("/") == 2 and m.isfile())
            or m.name == prefix + "pyproject.toml"
        ]
        tar.extractall(CACHE, members=members, filter="data")
    marker.write_text(version)
    return base


def _management(method: str, path: str, body: dict[str, object] | None = None) -> None:
    req = urllib.request.Request(
        MANAGEMENT + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={
            "content-type": "application/json",
            "authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
        },
    )
    with urllib.request.urlopen(req, timeout=30):
        pass


def create_vhost(name: str) -> str:
    """A fresh RabbitMQ vhost for one run (the suite insists on the queue name ``celery``)."""
    quoted = urllib.parse.quote(name, safe="")
    _management("PUT", f"/api/vhosts/{quoted}", {})
    _management(
        "PUT", f"/api/permissions/{quoted}/guest", {"configure": ".*", "write": ".*", "read": ".*"}
    )
    return f"amqp://guest:guest@{AMQP_HOST}:5672/{quoted}"


def delete_vhost(name: str) -> None:
    try:
        _management("DELETE", f"/api/vhosts/{urllib.parse.quote(name, safe='')}")
    except (urllib.error.URLError, OSError) as exc:
        print(f"warning: could not delete vhost {name}: {exc}", file=sys.stderr)


def delete_redis_prefix(*patterns: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    for pattern in patterns:
        batch = []
        for key in client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                client.delete(*batch)
                batch = []
        if batch:
            client.delete(*batch)


class SuiteError(RuntimeError):
    """The suite could not run at all (missing dependency, services down)."""


class SuiteHung(RuntimeError):
    """A run of the suite did not finish within ``--suite-timeout`` and was killed."""


#: Seconds between asking a hung run for its stacks (SIGABRT) and killing its session.
DUMP_GRACE = 10.0
HUNG_MARK = "== celery_compat: no end"


def run_watched(
    cmd: list[str], *, cwd: Path, env: dict[str, str], out: IO[str], limit: float
) -> bool:
    """Run ``cmd`` in a session of its own; False if it had to be killed after ``limit`` seconds.

    pytest-timeout ends one hung test, but only when the test lets its exception through: an
    interrupt swallowed in a ``finally`` (or a hang in a fixture's teardown) holds the whole run,
    and CI with it. On time-out the run gets SIGABRT first, so pytest's faulthandler writes every
    thread's stack to the log, then the whole session (pytest and anything it started) is killed.
    """
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        proc.wait(timeout=limit)
        return True
    except subprocess.TimeoutExpired:
        out.write(f"\n{HUNG_MARK} after {limit:.0f}s; SIGABRT for the stacks, then kill\n")
        out.flush()
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=DUMP_GRACE)
        return False
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@dataclass
class Run:
    """One pytest run: each test's result, and for a celery_dlx run what its drain did."""

    results: dict[str, gate.Result] = field(default_factory=dict)
    seconds: float = 0.0
    #: fate -> count in the run's failure history (celery_dlx runs only).
    fates: dict[str, int] = field(default_factory=dict)
    #: retries still parked when the run ended.
    left_parked: int = 0
    #: per session worker: was celery_dlx's drainer bootstep running in it (from the plugin).
    drainers: list[bool] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(r.outcome == outcome for r in self.results.values())


def _nodeid(workdir: Path, classname: str, name: str) -> str:
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        path = "/".join(parts[:i]) + ".py"
        if (workdir / path).exists():
            return "::".join([path, *parts[i:], name])
    return f"{classname}::{name}"


def parse_junit(workdir: Path, xml: Path) -> dict[str, gate.Result]:
    """Each test's result; a failed test keeps its first failure (a subtest's, or the call's
    before a teardown error)."""
    results: dict[str, gate.Result] = {}
    if not xml.exists():
        return results
    for case in ET.parse(xml).getroot().iter("testcase"):
        node = _nodeid(workdir, case.get("classname", ""), case.get("name", ""))
        failures = [e for e in case if e.tag in ("failure", "error")]
        if failures:
            first = failures[0]
            failure = gate.failure_from_junit(first.get("message", ""), first.text or "")
            result = gate.Result(gate.FAILED, failure)
        elif case.find("skipped") is not None:
            result = gate.Result(gate.SKIPPED)
        else:
            result = gate.Result(gate.PASSED)
        # A teardown error is a second entry for the same test: the worst outcome wins.
        if node not in results or results[node].outcome != gate.FAILED:
            results[node] = result
    return results


def read_drain(prefix: str) -> tuple[dict[str, int], int]:
    """The fates counted in ``prefix``'s failure history, and the retries still parked."""
    import redis

    from celery_dlx.message.names import Keys
    from celery_dlx.store.history import History

    client = redis.Redis.from_url(REDIS_URL)
    keys = Keys(prefix)
    history = History(client, keys)
    fates: dict[str, int] = {}
    start = "-"
    while rows := history.read(start, "+", count=1000):
        for _, fields in rows:
            fates[fields.get("fate", "")] = fates.get(fields.get("fate", ""), 0) + 1
        start = "(" + rows[-1][0]
    return fates, int(client.zcard(keys.parked_due))


def run_suite(
    suite: Path,
    targets: list[str],
    mode: str,
    *,
    budgets: str | None,
    timeout: int,
    tag: str,
    limit: float = 3600.0,
    rerun: bool = False,
) -> Run:
    """One pytest run of ``targets`` in a private copy of the suite, its own vhost and prefixes.

    A plain run of a whole file that passes nothing is a set-up error (services down, missing
    dependency); a ``rerun`` of a test alone may fail plain, which is what it is run to find out.
    """
    run_id = f"{tag}-{mode}-{uuid.uuid4().hex[:8]}"
    workdir = CACHE / "runs" / run_id
    shutil.copytree(suite / "t", workdir / "t")
    shutil.copy(suite / "pyproject.toml", workdir / "pyproject.toml")
    backend_prefix = f"celery-dlx-compat-{run_id}:"
    dlx_prefix = f"celery-dlx-compat-{run_id}"
    # The suite's conftest reads this file from its root directory to override its settings.
    (workdir / "integration-tests-config.json").write_text(
        json.dumps({"result_backend_transport_options": {"global_keyprefix": backend_prefix}})
    )
    vhost = f"celery-dlx-compat-{run_id}"
    broker = create_vhost(vhost)
    env = dict(os.environ)
    env.update(
        TEST_BROKER=broker,
        TEST_BACKEND=REDIS_URL,
        CELERY_DLX_COMPAT=mode,
        CELERY_DLX_COMPAT_PREFIX=dlx_prefix,
        CELERY_DLX_COMPAT_REDIS=REDIS_URL,
        PYTHONPATH=os.pathsep.join([str(workdir), str(ROOT), env.get("PYTHONPATH", "")]),
    )
    if budgets is not None:
        env["CELERY_DLX_COMPAT_BUDGETS"] = budgets
    xml = workdir / "junit.xml"
    log = CACHE / "reports" / f"{run_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *targets,
        "-p",
        "no:celery",
        "-p",
        "no:cacheprovider",
        "-p",
        "celery.contrib.pytest",
        "-p",
        "tests.compat.plugin",
        f"--junitxml={xml}",
        f"--timeout={timeout}",
        "-q",
        "-rN",
        "-o",
        "junit_family=xunit1",
        # Whole assertion diffs in the report: allowed.toml's patterns match what differs.
        "-o",
        "verbosity_assertions=2",
    ]
    started = time.monotonic()
    try:
        with log.open("w") as out:
            finished = run_watched(cmd, cwd=workdir, env=env, out=out, limit=limit)
        if not finished:
            stacks = log.read_text().split(HUNG_MARK, 1)[-1].splitlines()
            raise SuiteHung(
                f"{mode} run of {' '.join(targets)} did not finish in {limit:.0f}s and was killed; "
                f"the stacks of its threads (from {log}):\n" + "\n".join(stacks[:200])
            )
        run = Run(parse_junit(workdir, xml), time.monotonic() - started)
        if mode == "dlx":
            run.fates, run.left_parked = read_drain(dlx_prefix)
            run.drainers = gate.drainer_states(log.read_text())
        shutil.copy(xml, log.with_suffix(".xml")) if xml.exists() else None
    finally:
        delete_vhost(vhost)
        delete_redis_prefix(backend_prefix + "*", "{" + dlx_prefix + "}*", dlx_prefix + "*")
        shutil.rmtree(workdir, ignore_errors=True)
    if not run.count(gate.PASSED) and mode == "plain" and not rerun:
        raise SuiteError(
            f"no test ran in {' '.join(targets)} ({mode}); see {log}:\n"
            + "\n".join(log.read_text().splitlines()[-15:])
        )
    print(
        f"  {mode:5} {' '.join(targets)[:70]}: {_counts(run)} in {run.seconds:.0f}s "
        f"(log {log.relative_to(ROOT)})",
        flush=True,
    )
    return run


def _counts(run: Run) -> str:
    return ", ".join(f"{run.count(k)} {k}" for k in (gate.PASSED, gate.FAILED, gate.SKIPPED))


def load_allowed() -> dict[str, gate.AllowedDifference]:
    """The documented intended differences, by test node id, each naming an existing
    celery_dlx test of the intended behaviour."""
    if not ALLOWED.exists():
        return {}
    try:
        allowed = gate.parse_allowed(tomllib.loads(ALLOWED.read_text()))
    except ValueError as exc:
        raise SystemExit(f"{ALLOWED}: {exc}") from exc
    for entry in allowed.values():
        path, _, name = entry.instead.partition("::")
        if (
            not (ROOT / path).exists()
            or f"def {name.split('[')[0]}(" not in (ROOT / path).read_text()
        ):
            raise SystemExit(f"{ALLOWED}: {entry.test}: no test {entry.instead}")
    return allowed


def compare(
    suite: Path, file: str, args: argparse.Namespace, allowed: dict[str, gate.AllowedDifference]
) -> dict[str, Any]:
    """Run ``file`` plain and with celery_dlx on, rerun its differences, judge them."""
    target = f"t/integration/{file}"
    tag = Path(file).stem.replace("_", "-")

    def run(targets: list[str], mode: str, tag: str, rerun: bool = False) -> Run:
        return run_suite(
            suite,
            targets,
            mode,
            budgets=args.budgets if mode == "dlx" else None,
            timeout=args.timeout,
            tag=tag,
            limit=args.suite_timeout,
            rerun=rerun,
        )

    plain = run([target], "plain", tag)
    dlx = run([target], "dlx", tag)
    diffs = gate.differing(plain.results, dlx.results)
    verdicts = []
    reruns: dict[str, gate.Reruns] = {}
    for test in diffs:
        verdict = gate.first_look(test, dlx.results.get(test), allowed.get(test))
        if verdict is None:
            reruns[test] = rerun_alone(test, args.reruns, run, tag)
            verdict = gate.judge(test, dlx.results.get(test), allowed.get(test), reruns[test])
        verdicts.append(verdict)
    problem = gate.drain_problem(dlx.fates, dlx.drainers)
    return {
        "file": file,
        "plain_passed": plain.count(gate.PASSED),
        "plain_total": len(plain.results),
        "dlx_passed": dlx.count(gate.PASSED),
        "dlx_total": len(dlx.results),
        "passed_plain_failed_dlx": diffs,
        "allowed": [v.test for v in verdicts if v.kind == gate.ALLOWED],
        "flaky": [v.test for v in verdicts if v.kind == gate.FLAKY],
        "unexplained": [v.test for v in verdicts if v.kind == gate.REGRESSION],
        "verdicts": {
            v.test: _verdict(v, dlx.results.get(v.test), reruns.get(v.test)) for v in verdicts
        },
        "drain": {
            "parked": dlx.fates.get("parked", 0),
            "drained": dlx.fates.get("drained", 0),
            "left_parked": dlx.left_parked,
            "drainer_bootstep": dlx.drainers,
            "fates": dlx.fates,
            "problem": problem,
        },
        "seconds": round(plain.seconds + dlx.seconds),
    }


def rerun_alone(test: str, times: int, run: Callable[..., Run], tag: str) -> gate.Reruns:
    """Run ``test`` alone ``times`` times in each mode, plain and celery_dlx on in turn (so the
    machine's load falls on both alike)."""
    reruns = gate.Reruns()
    for i in range(times):
        for mode, seen in (("plain", reruns.plain), ("dlx", reruns.dlx)):
            seen.append(run([test], mode, f"{tag}-rerun{i + 1}", rerun=True).results.get(test))
    return reruns


def _verdict(
    verdict: gate.Verdict, dlx: gate.Result | None, reruns: gate.Reruns | None
) -> dict[str, Any]:
    """A verdict for the JSON report: why, the failure with celery_dlx on, the reruns."""
    shown: dict[str, Any] = {
        "verdict": verdict.kind,
        "why": verdict.why,
        "dlx_failure": str(dlx.failure)
        if dlx and dlx.failure
        else getattr(dlx, "outcome", "missing"),
    }
    if reruns is not None:
        shown["reruns"] = {
            mode: [r.outcome if r is not None else "missing" for r in results]
            for mode, results in (("plain", reruns.plain), ("dlx", reruns.dlx))
        }
    return shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "files",
        nargs="*",
        default=list(DEFAULT_FILES),
        help="files of t/integration (default: %(default)s)",
    )
    parser.add_argument(
        "--budgets",
        default=None,
        help="dlx_max_requeues and dlx_max_parks for the celery_dlx run (e.g. 0)",
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=300,
        help="pytest-timeout per test (the suite's own for flaky tests)",
    )
    parser.add_argument(
        "--suite-timeout",
        type=float,
        default=3600.0,
        help="seconds one pytest run of a file may take before it is killed (its threads' stacks "
        "in its log) and the gate fails (default: %(default)s; test_canvas.py with celery_dlx on "
        "takes about 26 minutes here)",
    )
    parser.add_argument(
        "--reruns",
        type=int,
        default=DEFAULT_RERUNS,
        help="times a differing test (not an allowed one failing as written down) is run again "
        "alone in each mode; it is flaky only if it fails plain too, the same way "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--no-rerun",
        dest="reruns",
        action="store_const",
        const=0,
        help="--reruns 0: every difference not allowed is a regression",
    )
    parser.add_argument("--json", type=Path, help="write the report as JSON to this file")
    args = parser.parse_args(argv)
    if args.reruns < 0:
        parser.error("--reruns must be 0 or more")
    version = celery_version()
    try:
        suite = fetch_suite(version)
        allowed = load_allowed()
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"set-up error: {exc}", file=sys.stderr)
        return 2
    budgets = f", budgets {args.budgets}" if args.budgets is not None else ""
    print(f"Celery {version} t/integration, plain vs celery_dlx on{budgets}", flush=True)
    try:
        reports = [compare(suite, f, args, allowed) for f in args.files]
    except SuiteError as exc:
        print(f"set-up error: {exc}", file=sys.stderr)
        return 2
    except SuiteHung as exc:
        print(f"HUNG: {exc}", file=sys.stderr)
        return 1
    print_report(reports, allowed)
    if args.json:
        args.json.write_text(
            json.dumps({"celery": version, "budgets": args.budgets, "files": reports}, indent=2)
        )
    failed = any(r["unexplained"] or r["drain"]["problem"] for r in reports)
    return 1 if failed else 0


def print_report(reports: list[dict[str, Any]], allowed: dict[str, gate.AllowedDifference]) -> None:
    print()
    print(
        f"{'file':28} {'plain pass':>11} {'dlx pass':>9} {'flaky':>6} {'allowed':>8} "
        f"{'unexplained':>12} {'parked':>7} {'drained':>8}"
    )
    for r in reports:
        drain = r["drain"]
        print(
            f"{r['file']:28} {r['plain_passed']:>5}/{r['plain_total']:<5} "
            f"{r['dlx_passed']:>4}/{r['dlx_total']:<4} {len(r['flaky']):>6} "
            f"{len(r['allowed']):>8} {len(r['unexplained']):>12} {drain['parked']:>7} "
            f"{drain['drained']:>8}"
        )
        verdicts = r["verdicts"]
        for t in r["unexplained"]:
            print(f"    UNEXPLAINED {t}: {verdicts[t]['why']}")
        for t in r["flaky"]:
            print(f"    flaky {t}: {verdicts[t]['why']}")
        for t in r["allowed"]:
            print(f"    allowed {t} ({allowed[t].expected()}): {allowed[t].reason}")
        running = drain["drainer_bootstep"]
        print(
            f"    drain: {drain['parked']} parked, {drain['drained']} drained by the session "
            f"worker's drainer bootstep (running in {sum(running)} of {len(running)} workers), "
            f"{drain['left_parked']} still parked at the end"
        )
        if drain["problem"]:
            print(f"    DRAIN PROBLEM: {drain['problem']}")


if __name__ == "__main__":
    sys.exit(main())
