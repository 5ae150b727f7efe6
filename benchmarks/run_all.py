"""Run every benchmark and rewrite the summary table of docs/benchmarks.md from this run.

Each benchmark script runs as its own process (its output is printed as it goes and kept in
``--log``); every script prints one ``SUMMARY {json}`` line per table row (``_common.summary``):
metric, target, median and verdict, with the load average when it was measured. The table in
docs/benchmarks.md between ``<!-- summary:start -->`` and ``<!-- summary:end -->`` is replaced
with these rows, the command, the date and the machine's load before and after.

``--quick`` is a smoke run: small counts, 3 rounds each, minutes instead of hours; its figures
are labelled as such. ``--only P1,P10`` runs some benchmarks (the table then keeps the other
rows of the previous run). chaos.py is not run: it restarts RabbitMQ and Redis.

Benchmarks run in pieces (issue 23 item 7): each of P1, P2, P3, P6, P7 and P10 runs alone in at
most 20 minutes in full mode, its baseline and peer in the same run (``--only P10 --log
FILE``), and ``--from-log A.log B.log ...`` assembles the table from several such runs, each row
saying which run it came from (command, start time, commit, load). A row of a benchmark that
several logs ran comes from the last of them on the command line. Every log starts with a
``RUN {json}`` line (command, mode, start, commit, load) and ends with an ``END {json}`` line.
P7S (P7 on a private 2-worker Spark standalone cluster) runs only when ``--only`` names it.

Run: .venv/bin/python benchmarks/run_all.py [--quick] [--only P1,P10] [--no-docs] [--log FILE]
     .venv/bin/python benchmarks/run_all.py --from-log P10.log P1.log ...
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOC = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- summary:start -->", "<!-- summary:end -->"

#: (id, script, full-mode arguments, quick-mode arguments), in the order they run: the timed
#: benchmarks first, while the machine is as quiet as it will be, then the ones that count or size
#: something (UNTIMED), whose figures the load does not move. P3 last: its full mode is the longest.
BENCHMARKS: list[tuple[str, str, list[str], list[str]]] = [
    (
        "P1",
        "p1_clog.py",
        ["--good", "1000", "--rounds", "3", "--pools", "prefork,solo,threads"],
        ["--good", "300", "--rounds", "3", "--pools", "prefork,solo,threads"],
    ),
    (
        "P2",
        "p2_success.py",
        ["--tasks", "5000", "--rounds", "3", "--pools", "prefork,solo,threads"],
        ["--tasks", "1000", "--rounds", "3", "--pools", "prefork,solo,threads"],
    ),
    (
        "P10",
        "p10_intake.py",
        ["--tasks", "8000", "--rounds", "3", "--pools", "prefork,solo,threads"],
        ["--tasks", "2000", "--rounds", "3", "--pools", "prefork,solo,threads"],
    ),
    (
        "P4",
        "p4_drain.py",
        ["--messages", "30000", "--rounds", "3"],
        ["--messages", "5000", "--rounds", "3"],
    ),
    (
        "P5",
        "p5_punctuality.py",
        ["--messages", "3000", "--rounds", "3"],
        ["--messages", "1000", "--spread", "8", "--rounds", "3"],
    ),
    (
        "P6",
        "p6_service.py",
        ["--messages", "10000", "--rounds", "3", "--services", "1,2"],
        ["--messages", "5000", "--rounds", "3", "--services", "1,2"],
    ),
    (
        "P7",
        "p7_spark.py",
        ["--sizes", "100000,1000000", "--rounds", "3", "--cores", "2"],
        ["--sizes", "20000,100000", "--sources", "redis", "--rounds", "3", "--cores", "2"],
    ),
    (
        "P7S",
        "p7_spark.py",
        ["--sizes", "1000000", "--sources", "jsonl", "--rounds", "3", "--standalone-only"],
        ["--sizes", "20000", "--sources", "jsonl", "--rounds", "3", "--standalone-only"],
    ),
    ("P8", "p8_noise.py", [], []),
    (
        "P9",
        "p9_sizing.py",
        [],
        ["--parked", "10000", "--obituaries", "2000", "--history", "10000", "--body-bytes", "1024"],
    ),
    (
        "P3",
        "p3_memory.py",
        # 20 minutes in full mode (issue 23 item 7); the 2.5-hour shape of earlier runs was
        # --warmup 2000 --parked 20000 --parked-high 120000.
        [
            *("--warmup", "1000", "--parked", "4000", "--parked-high", "12000"),
            *("--plain", "1000", "--rounds", "3"),
        ],
        ["--warmup", "1000", "--parked", "1000", "--parked-high", "4000", "--rounds", "3"],
    ),
]


#: Seconds a benchmark may take in full mode: each runs alone, on its own, in a 20-minute window.
BUDGET = 20 * 60


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}/{five:.2f}/{fifteen:.2f}"


def commit() -> str:
    """The checkout's commit, ``+changes`` when the package or the benchmarks differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    head = git("rev-parse", "--short=10", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--", "celery_dlx", "celery_dlx_spark", "benchmarks")
    return head + ("+changes" if changed else "")


def run(
    bench: str, script: str, args: list[str], log: object
) -> tuple[int, list[dict[str, str]], float]:
    """Run one script, echo and log its output; its exit code, SUMMARY rows and seconds.

    A row whose id is not the piece's own (P7S runs p7_spark.py, whose rows say P7) is logged
    under the piece's id, so a merge of logs keeps the two apart."""
    cmd = [sys.executable, str(HERE / script), *args]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}", "PYTHONUNBUFFERED": "1"}
    header = f"\n### {shlex.join(['python', f'benchmarks/{script}', *args])}  [load {load()}]"
    print(header, flush=True)
    print(header, file=log, flush=True)  # type: ignore[call-overload]
    started = time.monotonic()
    rows: list[dict[str, str]] = []
    with subprocess.Popen(
        cmd, cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("SUMMARY "):
                row = json.loads(line[len("SUMMARY ") :])
                if base_id(row["bench"]) != bench:
                    row["bench"] = bench
                    line = "SUMMARY " + json.dumps(row, sort_keys=True) + "\n"
                rows.append(row)
            print(line, end="", flush=True)
            print(line, end="", file=log, flush=True)  # type: ignore[call-overload]
    return proc.returncode, rows, time.monotonic() - started


#: Pieces run only when ``--only`` names them: P7S is P7 on a private 2-worker Spark standalone
#: cluster (its JVMs would not fit P7's 20 minutes).
OPTIONAL = {"P7S"}

#: Rows that count or size something (memory, log lines, bytes): the machine's load does not move
#: them. Every other row is a timing.
UNTIMED = {"P3", "P8", "P9"}


def verdict(row: dict[str, str], quick: bool) -> str:
    """The row's verdict, qualified when it is a timing from a quick run or a loaded machine."""
    text = row.get("verdict", "")
    if row.get("bench") in UNTIMED or text in ("measured", "not run") or "(noisy" in text:
        return text
    try:
        busy = float(str(row.get("load", "0")).split("/")[0]) > 1.0
    except ValueError:
        busy = True
    if quick or busy:
        return f"{text} (noisy: {'quick run, ' if quick else ''}load {row.get('load', '?')}; not a claim)"
    return text


def cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


#: The table's columns: a row's keys, in order.
COLUMNS = ("bench", "metric", "target", "measured", "verdict", "load", "run")


def run_label(meta: dict[str, str]) -> str:
    """Which run a row is from: command, start, commit, load at its start and end."""
    return (
        f"`{meta.get('command', '?')}`, {meta.get('started', '?')}, commit "
        f"{meta.get('commit', '?')}, load {meta.get('load_before', '?')} -> "
        f"{meta.get('load_after', '?')}"
    )


def table(rows: list[dict[str, str]], quick: bool = False) -> list[str]:
    out = [
        "| | metric | target | median (rounds) | verdict | load 1/5/15 min | run |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        mode_quick = quick or row.get("mode") == "quick"
        out.append(
            "| "
            + " | ".join(
                cell(verdict(row, mode_quick) if k == "verdict" else row.get(k, ""))
                for k in COLUMNS
            )
            + " |"
        )
    return out


def rewrite_doc(rows: list[dict[str, str]], header: list[str], quick: bool) -> None:
    text = DOC.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{DOC} has no {START} ... {END} markers")
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    body = "\n".join([START, *header, "", *table(rows, quick), END])
    DOC.write_text(before + body + after)


def previous_rows() -> list[dict[str, str]]:
    """The rows of the table now in the doc (kept for benchmarks this run skips)."""
    text = DOC.read_text()
    if START not in text:
        return []
    block = text.split(START, 1)[1].split(END, 1)[0]
    rows = []
    for line in block.splitlines():
        if not line.startswith("| ") or line.startswith(("| |", "| ---")):
            continue
        parts = [p.strip().replace("\\|", "|") for p in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        if len(parts) in (len(COLUMNS) - 1, len(COLUMNS)):  # tables before the run column too
            row = dict(zip(COLUMNS, parts, strict=False))
            # A verdict cell already carries its noisy note: keep it as it is.
            rows.append(row)
    return rows


def read_log(path: Path) -> tuple[dict[str, str], list[dict[str, str]]]:
    """A run's metadata (``RUN`` and ``END`` lines) and its rows, each tagged with the run."""
    lines = path.read_text().splitlines()
    meta = json.loads(lines[0][len("RUN ") :]) if lines and lines[0].startswith("RUN ") else {}
    meta = {
        **meta,
        **next((json.loads(x[4:]) for x in reversed(lines) if x.startswith("END ")), {}),
    }
    rows = [json.loads(x[len("SUMMARY ") :]) for x in lines if x.startswith("SUMMARY ")]
    if not rows or "command" not in meta:
        raise SystemExit(f"{path}: no RUN header or no SUMMARY lines")
    if not meta.get("finished"):
        print(f"warning: {path} has no END line (the run did not finish)")
    for row in rows:
        row.setdefault("mode", meta.get("mode", "full"))
        row["run"] = run_label(meta)
    return meta, rows


def from_logs(paths: list[Path]) -> None:
    """Rewrite the doc's table from finished runs' logs: per benchmark, the last log that ran it."""
    runs: list[dict[str, str]] = []
    by_bench: dict[str, list[dict[str, str]]] = {}
    for path in paths:
        meta, rows = read_log(path)
        runs.append(meta)
        ran: dict[str, list[dict[str, str]]] = {}
        for row in rows:
            ran.setdefault(base_id(row["bench"]), []).append(row)
        by_bench.update(ran)  # a later log's rows of a benchmark replace an earlier one's
    write([row for bench_rows in by_bench.values() for row in bench_rows], runs)


def base_id(bench: str) -> str:
    """A script's extra ids (P3b of p3_memory.py) go with its own."""
    return re.sub(r"[a-z]+$", "", bench)


def write(rows: list[dict[str, str]], runs: list[dict[str, str]]) -> None:
    ran = {base_id(r["bench"]) for r in rows}
    kept = [r for r in previous_rows() if base_id(r["bench"]) not in ran]
    commits = sorted({meta.get("commit", "?") for meta in runs})
    lines = []
    for meta in runs:
        took = meta.get("seconds")
        lines.append(
            f"- {run_label(meta)}, {meta.get('mode', '?')} mode"
            + (f", took {float(took) / 60:.0f} min" if took else "")
        )
    header = [
        f"Assembled by `run_all.py` from {len(runs)} run(s) on a 2-core machine, on commit"
        f"{'s' if len(commits) > 1 else ''} {', '.join(commits)}"
        + (" (NOT one commit: compare with care)" if len(commits) > 1 else "")
        + ". Each row's last column says which run it is from (command, start, commit, load "
        "average 1/5/15 min at the start and the end); the load column is the load when the row "
        "was measured. Wall-clock figures on a shared machine are noisy: timing verdicts measured "
        "in a quick run or at a load above 1 are marked `noisy`: they say how this run went, not "
        "whether the target is met; the rows of P3 (memory), P8 (log lines, events) and P9 "
        "(bytes) do not depend on the load.",
        "",
        "Runs:",
        "",
        *lines,
    ]
    if kept:
        header.append(
            "\nRows of " + ", ".join(sorted({r["bench"] for r in kept})) + " are from earlier "
            "runs (these did not run them); their run column says which, when it is known."
        )
    for row in kept:
        row["run"] = row.get("run") or "an earlier run (not recorded)"
    order = [b[0] for b in BENCHMARKS]
    merged = sorted(
        rows + kept,
        key=lambda r: order.index(base_id(r["bench"])) if base_id(r["bench"]) in order else 99,
    )
    # Each row's own mode says whether it is from a quick run (kept rows carry their verdict).
    rewrite_doc(merged, header, quick=False)
    print(f"rewrote the summary table of {DOC}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small counts, 3 rounds")
    parser.add_argument("--only", default="", help="benchmark ids, e.g. P1,P10")
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    parser.add_argument("--log", default=None, help="keep the full output here")
    parser.add_argument(
        "--from-log",
        nargs="+",
        default=None,
        metavar="LOG",
        help="run nothing: rewrite the doc's table from the SUMMARY lines of earlier runs' "
        "--log files (per benchmark, the last log on the command line that ran it)",
    )
    args = parser.parse_args()
    if args.from_log:
        from_logs([Path(p) for p in args.from_log])
        return
    only = {b.strip().upper() for b in args.only.split(",") if b.strip()}
    unknown = only - {b[0] for b in BENCHMARKS}
    if unknown:
        raise SystemExit(f"unknown benchmark id(s): {', '.join(sorted(unknown))}")
    chosen = [b for b in BENCHMARKS if b[0] in only or (not only and b[0] not in OPTIONAL)]
    mode = "quick" if args.quick else "full"
    log_path = Path(args.log or f"/tmp/run_all-{mode}-{int(time.time())}.log")
    started_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_before = load()
    rows: list[dict[str, str]] = []
    failed: list[str] = []
    command = (
        "python benchmarks/run_all.py"
        + (" --quick" if args.quick else "")
        + (f" --only {args.only}" if args.only else "")
    )
    meta = {
        "command": command,
        "mode": mode,
        "started": started_at,
        "load_before": load_before,
        "commit": commit(),
    }
    print(f"run {command} on commit {meta['commit']}, load {load_before}; log {log_path}")
    run_started = time.monotonic()
    with open(log_path, "w") as log:
        print("RUN " + json.dumps(meta), file=log, flush=True)
        for bench, script, full, quick in chosen:
            code, got, seconds = run(bench, script, quick if args.quick else full, log)
            for row in got:
                row["mode"] = mode
            rows += got
            if code != 0 or not got:
                failed.append(f"{bench} (exit {code}, {len(got)} rows)")
                row = {
                    "bench": bench,
                    "metric": f"{script} did not finish",
                    "target": "",
                    "measured": f"exit code {code}; see the run's log",
                    "verdict": "not run",
                    "load": load(),
                }
                rows.append(row)
                print("SUMMARY " + json.dumps(row), file=log, flush=True)
            over = not args.quick and seconds > BUDGET
            took = f"[{bench} took {seconds:.0f}s" + (
                f", OVER its {BUDGET // 60}-minute budget]" if over else "]"
            )
            print(took, flush=True)
            print("TOOK " + json.dumps({"bench": bench, "seconds": round(seconds)}), file=log)
    load_after = load()
    seconds = round(time.monotonic() - run_started)
    with open(log_path, "a") as log:
        end = {"load_after": load_after, "finished": True, "seconds": seconds}
        print("END " + json.dumps(end), file=log)
    print("\n== summary")
    for row in rows:
        row["run"] = run_label({**meta, "load_after": load_after})
    for line in table(rows, args.quick):
        print(line)
    if failed:
        print("did not finish: " + ", ".join(failed))
    print(f"load before {load_before}, after {load_after}; took {seconds}s; log {log_path}")
    if args.no_docs:
        return
    from_logs([log_path])


if __name__ == "__main__":
    main()
