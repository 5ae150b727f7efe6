"""docs/benchmarks.md's tables are rendered by benchmarks/run_all.py from benchmarks/results/."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture(scope="module")
def run_all() -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_all", ROOT / "benchmarks" / "run_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def summary(bench: str, measured: str, verdict: str = "met", load: str = "0.10/0.10/0.10") -> str:
    row = {
        "bench": bench,
        "metric": f"{bench} metric",
        "target": ">= 1.0x",
        "measured": measured,
        "verdict": verdict,
        "load": load,
    }
    return "SUMMARY " + json.dumps(row)


RUN = {"command": "python benchmarks/run_all.py", "mode": "full", "started": "2026-01-02 03:04 UTC"}
LOG = "\n".join(
    [
        "RUN " + json.dumps({**RUN, "load_before": "0.1/0.1/0.1", "commit": "abc1234"}),
        "",
        "### python benchmarks/p1_clog.py --good 1000  [load 0.1/0.1/0.1]",
        "round 1: celery_dlx 1.01x",
        summary("P1", "1.01x (rounds 1.01, 1.02, 1.00); Dramatiq 1.10x"),
        'TOOK {"bench": "P1", "seconds": 120}',
        "",
        "### python benchmarks/p3_memory.py --warmup 1000  [load 0.2/0.1/0.1]",
        summary("P3", "+0.5 MiB (rounds +0.5, +0.5, +0.6), 0 unacked; Dramatiq +0.2 MiB"),
        summary("P3b", "9 ms (rounds 9, 9, 10)"),
        'TOOK {"bench": "P3", "seconds": 900}',
        'END {"load_after": "0.3/0.2/0.1", "finished": true, "seconds": 1020}',
    ]
)


def test_a_run_is_split_into_one_log_per_piece(run_all: ModuleType) -> None:
    pieces = run_all.split_log(LOG)
    assert list(pieces) == ["P1", "P3"]
    p1 = pieces["P1"].splitlines()
    assert p1[0].startswith("RUN ") and p1[-1].startswith("END ")
    assert "round 1: celery_dlx 1.01x" in p1 and not any("P3" in line for line in p1)
    assert sum(line.startswith("SUMMARY ") for line in pieces["P3"].splitlines()) == 2


def test_a_log_without_its_run_line_is_refused(run_all: ModuleType) -> None:
    with pytest.raises(ValueError, match="RUN"):
        run_all.split_log(LOG.split("\n", 1)[1])


def test_a_piece_table_puts_the_baseline_and_peer_beside_celery_dlx(
    run_all: ModuleType, tmp_path: Path
) -> None:
    log = tmp_path / "P1.log"
    log.write_text(run_all.split_log(LOG)["P1"])
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# B\n\n<!-- results:P1 -->\nold\n<!-- /results:P1 -->\n\nafter\n")
    assert run_all.render_tables([log], doc=doc) == ["P1"]
    text = doc.read_text()
    assert "old" not in text and text.endswith("after\n")
    assert "commit abc1234" in text and "2 min" in text
    assert (
        "| P1 metric | >= 1.0x | 1.01x (rounds 1.01, 1.02, 1.00) | Dramatiq 1.10x | met |" in text
    )


def test_a_timing_on_a_busy_machine_is_marked_noisy(run_all: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "P1.log"
    log.write_text(LOG.replace('"load": "0.10/0.10/0.10"', '"load": "3.00/2.00/1.00"'))
    doc = tmp_path / "benchmarks.md"
    doc.write_text(
        "<!-- results:P1 -->\n<!-- /results:P1 -->\n<!-- results:P3 -->\n<!-- /results:P3 -->"
    )
    run_all.render_tables([log], doc=doc)
    text = doc.read_text()
    assert "| met (noisy: load 3.00/2.00/1.00; not a claim) |" in text  # P1: a timing
    assert "| +0.5 MiB (rounds +0.5, +0.5, +0.6), 0 unacked | Dramatiq +0.2 MiB | met |" in text


def test_a_doc_without_the_pieces_block_is_an_error(run_all: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "P1.log"
    log.write_text(LOG)
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# nothing to fill\n")
    with pytest.raises(SystemExit, match="results:P1"):
        run_all.render_tables([log], doc=doc)


def test_the_page_shows_the_latest_logs(run_all: ModuleType, tmp_path: Path) -> None:
    logs = sorted(RESULTS.glob("*.log"))
    assert {p.stem for p in logs} >= {"P1", "P2", "P3", "P10"}
    copy = tmp_path / "benchmarks.md"
    copy.write_text(DOC.read_text())
    run_all.render_tables(logs, doc=copy)
    assert copy.read_text() == DOC.read_text(), (
        "docs/benchmarks.md is out of date: run `python benchmarks/run_all.py --tables`"
    )


def test_the_page_is_results_not_a_notebook() -> None:
    assert len(DOC.read_text().splitlines()) <= 300
    assert list((ROOT / "docs").rglob("*.log")) == []
