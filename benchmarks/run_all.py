"""Run the benchmarks, keep each piece's log in benchmarks/results/ and render docs/benchmarks.md's tables.

Each benchmark script runs as its own process (its output is printed as it goes and kept in
``--log``); every script prints one ``SUMMARY {json}`` line per table row (``_common.summary``):
metric, target, median and verdict, with the load average when it was measured. A log starts with
a ``RUN {json}`` line (command, mode, start, commit, load) and ends with an ``END {json}`` line.

After a run, the log is split into one log per piece, ``benchmarks/results/<piece>.log`` (the
latest run of each piece only: git keeps the earlier ones), and the piece's table in
docs/benchmarks.md (between ``<!-- results:P1 -->`` and ``<!-- /results:P1 -->``) is rendered from
it: one row per figure, celery_dlx's median and rounds beside the baseline's and the peer's
(Dramatiq, Celery autoretry) of the same run, the target and the verdict, under a line naming the
run (command, start, commit, load). ``--tables`` renders the tables from the logs in
benchmarks/results/ without running anything.

``--quick`` is a smoke run: small counts, 3 rounds each, minutes instead of hours; its figures
are labelled as such. ``--only P1,P10`` runs some pieces; each of P1, P2, P3, P6, P7 and P10 runs
alone in at most 20 minutes in full mode, its baseline and peer in the same run. chaos.py is not
run: it restarts RabbitMQ and Redis. P7S (P7 on a private 2-worker Spark standalone cluster) runs
only when ``--only`` names it.

Run: .venv/bin/python benchmarks/run_all.py [--quick] [--only P1,P10] [--no-docs] [--log FILE]
     .venv/bin/python benchmarks/run_all.py --tables [LOG ...]
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
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOC = ROOT / "docs" / "benchmarks.md"
#: The latest log of each piece, ``<piece>.log``.
RESULTS = HERE / "results"

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
    changed = git(
        "status",
        "--porcelain",
        "--",
        "celery_dlx",
        "celery_dlx_console",
        "celery_dlx_spark",
        "benchmarks",
    )
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


def base_id(bench: str) -> str:
    """A script's extra ids (P3b of p3_memory.py) go with its own."""
    return re.sub(r"[a-z]+$", "", bench)


def split_log(text: str) -> dict[str, str]:
    """One run's log as one log per piece: its ``RUN`` line, the piece's output, its ``END`` line.

    A piece's output starts at its ``### python benchmarks/...`` header; which piece it is comes
    from its ``TOOK`` line, or (logs older than those lines) from its ``SUMMARY`` rows.
    """
    lines = text.splitlines()
    if not lines or not lines[0].startswith("RUN "):
        raise ValueError("no RUN line at the top: not a run_all.py log")
    end = next((x for x in reversed(lines) if x.startswith("END ")), None)
    sections: list[list[str]] = []
    for line in lines[1:]:
        if line.startswith("### python benchmarks/"):
            sections.append([])
        if sections and not line.startswith("END "):
            sections[-1].append(line)
    pieces: dict[str, str] = {}
    for section in sections:
        took = [json.loads(x[5:])["bench"] for x in section if x.startswith("TOOK ")]
        rows = [json.loads(x[8:])["bench"] for x in section if x.startswith("SUMMARY ")]
        piece = took[0] if took else base_id(rows[0]) if rows else None
        if piece is None:
            continue
        while section and not section[-1].strip():
            section.pop()
        pieces[piece] = "\n".join([lines[0], "", *section, *([end] if end else [])]) + "\n"
    return pieces


def save_results(log: Path) -> list[Path]:
    """Split a run's log into benchmarks/results/<piece>.log, replacing those pieces' logs."""
    RESULTS.mkdir(exist_ok=True)
    written = []
    for piece, text in split_log(log.read_text()).items():
        path = RESULTS / f"{piece}.log"
        path.write_text(text)
        written.append(path)
    return written


def read_log(path: Path) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """A piece's log: the run's metadata (``RUN``, ``END`` and ``TOOK`` lines) and its rows."""
    lines = path.read_text().splitlines()
    meta: dict[str, Any] = (
        json.loads(lines[0][len("RUN ") :]) if lines and lines[0].startswith("RUN ") else {}
    )
    for line in lines:
        if line.startswith("END "):
            meta.update(json.loads(line[4:]))
        elif line.startswith("TOOK "):
            meta["took"] = json.loads(line[5:])["seconds"]
    rows = [json.loads(x[len("SUMMARY ") :]) for x in lines if x.startswith("SUMMARY ")]
    if not rows or "command" not in meta:
        raise SystemExit(f"{path}: no RUN header or no SUMMARY lines")
    for row in rows:
        row.setdefault("mode", meta.get("mode", "full"))
    return meta, rows


#: Pieces whose ``measured`` text is one figure list, not celery_dlx's figure then its baselines.
NOT_SPLIT = {"P9"}


def piece_table(piece: str, meta: dict[str, Any], rows: list[dict[str, str]], log: str) -> str:
    """The Markdown of one piece's results: which run, then a row per figure."""
    took = meta.get("took")
    run = (
        f"Latest run: `{meta.get('command', '?')}`, {meta.get('mode', '?')} mode, started "
        f"{meta.get('started', '?')}, commit {meta.get('commit') or 'not recorded'}, load "
        f"{meta.get('load_before', '?')} -> {meta.get('load_after', '?')}"
        + (f", {float(took) / 60:.0f} min" if took else "")
        + f"; log `{log}`."
    )
    out = [
        run,
        "",
        "| metric | target | celery_dlx: median (rounds) | baseline and peer, same run | verdict |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        measured = str(row.get("measured", ""))
        ours, _, theirs = (measured, "", "") if piece in NOT_SPLIT else measured.partition("; ")
        quick = row.get("mode") == "quick"
        cells = [row.get("metric", ""), row.get("target", ""), ours, theirs or "-"]
        cells.append(verdict({**row, "bench": piece}, quick))
        out.append("| " + " | ".join(cell(c) for c in cells) + " |")
    return "\n".join(out)


def marker(piece: str) -> tuple[str, str]:
    return f"<!-- results:{piece} -->", f"<!-- /results:{piece} -->"


def render_tables(logs: list[Path], doc: Path = DOC) -> list[str]:
    """Rewrite the results table of each piece a log ran (the last log of a piece wins).

    Returns the pieces rendered. Raises SystemExit when the doc has no block for a piece.
    """
    latest: dict[str, tuple[dict[str, Any], list[dict[str, str]], Path]] = {}
    for path in logs:
        meta, rows = read_log(path)
        for piece in dict.fromkeys(base_id(r["bench"]) for r in rows):
            mine = [r for r in rows if base_id(r["bench"]) == piece]
            latest[piece] = (meta, mine, path)
    text = doc.read_text()
    for piece, (meta, rows, path) in latest.items():
        start, end = marker(piece)
        if start not in text or end not in text:
            raise SystemExit(f"{doc} has no {start} ... {end} block for {path}")
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        before, rest = text.split(start, 1)
        _, after = rest.split(end, 1)
        body = piece_table(piece, meta, rows, str(shown))
        text = f"{before}{start}\n{body}\n{end}{after}"
    doc.write_text(text)
    return list(latest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small counts, 3 rounds")
    parser.add_argument("--only", default="", help="benchmark ids, e.g. P1,P10")
    parser.add_argument(
        "--no-docs",
        action="store_true",
        help="keep the log only: do not replace benchmarks/results/ nor the doc's tables",
    )
    parser.add_argument("--log", default=None, help="keep the full output here")
    parser.add_argument(
        "--tables",
        nargs="*",
        default=None,
        metavar="LOG",
        help="run nothing: render docs/benchmarks.md's tables from these piece logs (default: "
        "benchmarks/results/*.log; a piece's last log on the command line wins)",
    )
    args = parser.parse_args()
    if args.tables is not None:
        logs = [Path(p) for p in args.tables] or sorted(RESULTS.glob("*.log"))
        if not logs:
            raise SystemExit(f"no logs given and none in {RESULTS}")
        print(f"rendered the tables of {', '.join(render_tables(logs))} in {DOC}")
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
    saved = save_results(log_path)
    print(f"rendered the tables of {', '.join(render_tables(saved))} in {DOC}")


if __name__ == "__main__":
    main()
