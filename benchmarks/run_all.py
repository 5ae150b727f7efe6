"""Run every benchmark and rewrite the summary table of docs/benchmarks.md from this run.

Each benchmark script runs as its own process (its output is printed as it goes and kept in
``--log``); every script prints one ``SUMMARY {json}`` line per table row (``_common.summary``):
metric, target, median and verdict, with the load average when it was measured. The table in
docs/benchmarks.md between ``<!-- summary:start -->`` and ``<!-- summary:end -->`` is replaced
with these rows, the command, the date and the machine's load before and after.

``--quick`` is a smoke run: small counts, 3 rounds each, minutes instead of hours; its figures
are labelled as such. ``--only P1,P10`` runs some benchmarks (the table then keeps the other
rows of the previous run). chaos.py is not run: it restarts RabbitMQ and Redis.

Run: .venv/bin/python benchmarks/run_all.py [--quick] [--only P1,P10] [--no-docs]
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
        ["--tasks", "20000", "--rounds", "3", "--pools", "prefork,solo,threads"],
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
        ["--warmup", "2000", "--parked", "20000", "--parked-high", "120000", "--rounds", "3"],
        ["--warmup", "1000", "--parked", "1000", "--parked-high", "4000", "--rounds", "3"],
    ),
]


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}/{five:.2f}/{fifteen:.2f}"


def run(script: str, args: list[str], log: object) -> tuple[int, list[dict[str, str]], float]:
    """Run one script, echo and log its output; its exit code, SUMMARY rows and seconds."""
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
            print(line, end="", flush=True)
            print(line, end="", file=log, flush=True)  # type: ignore[call-overload]
            if line.startswith("SUMMARY "):
                rows.append(json.loads(line[len("SUMMARY ") :]))
    return proc.returncode, rows, time.monotonic() - started


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


def table(rows: list[dict[str, str]], quick: bool = False) -> list[str]:
    out = [
        "| | metric | target | median (rounds) | verdict | load 1/5/15 min |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        out.append(
            "| "
            + " | ".join(
                cell(verdict(row, quick) if k == "verdict" else row.get(k, ""))
                for k in ("bench", "metric", "target", "measured", "verdict", "load")
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
    names = ("bench", "metric", "target", "measured", "verdict", "load")
    rows = []
    for line in block.splitlines():
        if not line.startswith("| ") or line.startswith(("| |", "| ---")):
            continue
        parts = [p.strip().replace("\\|", "|") for p in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        if len(parts) == len(names):
            rows.append(dict(zip(names, parts, strict=True)))
    return rows


def from_log(path: Path) -> None:
    """Rewrite the doc's table from a finished run's log (its header line says how it ran)."""
    lines = path.read_text().splitlines()
    meta = json.loads(lines[0][len("RUN ") :]) if lines and lines[0].startswith("RUN ") else {}
    if not meta.get("finished"):
        meta = {
            **meta,
            **next((json.loads(x[4:]) for x in reversed(lines) if x.startswith("END ")), {}),
        }
    rows = [json.loads(x[len("SUMMARY ") :]) for x in lines if x.startswith("SUMMARY ")]
    if not rows or "command" not in meta:
        raise SystemExit(f"{path}: no RUN header or no SUMMARY lines")
    write(rows, meta)


def write(rows: list[dict[str, str]], meta: dict[str, str]) -> None:
    ran = {r["bench"] for r in rows}
    # A script's extra ids (P3b of p3_memory.py) go with its own: kept only if it did not run.
    kept = [r for r in previous_rows() if re.sub(r"[a-z]+$", "", r["bench"]) not in ran]
    quick = meta["mode"] == "quick"
    header = [
        f"Generated by `{meta['command']}` on {meta['started']} on a 2-core machine "
        f"({meta['mode']} mode{': small counts, a smoke run' if quick else ''}); machine load "
        f"average (1/5/15 min) {meta['load_before']} at the start and {meta.get('load_after', '?')} "
        "at the end, and per row when it was measured. The machine was shared with other work "
        "during the run: wall-clock figures are noisy, and a verdict on a loaded machine is not a "
        "measurement on an idle one. Timing verdicts measured in a quick run or at a load above 1 "
        "are marked `noisy`: they say how this run went, not whether the target is met; the rows "
        "of P3 (memory), P8 (log lines, events) and P9 (bytes) do not depend on the load.",
    ]
    if kept:
        header.append(
            "\nRows of " + ", ".join(sorted({r["bench"] for r in kept})) + " are from an earlier "
            "`run_all.py` run (this one did not run them)."
        )
    rewrite_doc(rows + kept, header, quick)
    print(f"rewrote the summary table of {DOC}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small counts, 3 rounds")
    parser.add_argument("--only", default="", help="benchmark ids, e.g. P1,P10")
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    parser.add_argument("--log", default=None, help="keep the full output here")
    parser.add_argument(
        "--from-log",
        default=None,
        help="run nothing: rewrite the doc from the SUMMARY lines of an earlier run's --log",
    )
    args = parser.parse_args()
    if args.from_log:
        from_log(Path(args.from_log))
        return
    only = {b.strip().upper() for b in args.only.split(",") if b.strip()}
    chosen = [b for b in BENCHMARKS if not only or b[0] in only]
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
    meta = {"command": command, "mode": mode, "started": started_at, "load_before": load_before}
    with open(log_path, "w") as log:
        print("RUN " + json.dumps(meta), file=log, flush=True)
        for bench, script, full, quick in chosen:
            code, got, seconds = run(script, quick if args.quick else full, log)
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
            print(f"[{bench} took {seconds:.0f}s]", flush=True)
    load_after = load()
    with open(log_path, "a") as log:
        print("END " + json.dumps({"load_after": load_after, "finished": True}), file=log)
    print("\n== summary")
    for line in table(rows, args.quick):
        print(line)
    if failed:
        print("did not finish: " + ", ".join(failed))
    print(f"load before {load_before}, after {load_after}; full output in {log_path}")
    if args.no_docs:
        return
    write(rows, {**meta, "load_after": load_after})


if __name__ == "__main__":
    main()
