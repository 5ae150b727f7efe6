#!/usr/bin/env python
"""The size of the core: the celery_dlx modules a worker loads, and their lines.

Starts ``celery -A example_project.app worker`` (Celery's defaults: prefork, mingle, gossip; the
DLX service in a thread of the worker, as the example app configures it) under a run name of its
own, writes down ``sys.modules`` when the worker is ready (``worker_ready``, in the main process,
after the consumer has declared the topology and started its bootsteps), stops the worker with
SIGTERM and deletes the run's queues, exchanges and Redis keys. Then it prints the lines of every celery_dlx
module that was loaded, and the lines of the whole package beside them; and the lines of the
optional packages shipped beside it (the console, the Spark job) with how many of their modules
the worker loaded (none, as the import contracts in pyproject.toml require).

Needs the real services (RabbitMQ and Redis on loopback). Run it from a checkout::

    PYTHONPATH=$PWD python scripts/core_size.py            # totals
    PYTHONPATH=$PWD python scripts/core_size.py --modules  # and one line per module loaded

Exit status: 0 when the worker became ready, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "celery_dlx"
#: The packages beside it in the same distribution, which a worker does not load.
PRODUCTS = ("celery_dlx_console", "celery_dlx_edit", "celery_dlx_spark")
#: Seconds a worker gets to become ready (mingle alone waits about one).
READY_TIMEOUT = 120

#: Runs in the worker's process: Celery's own command line, plus a worker_ready receiver that
#: writes sys.modules down and asks for a warm shutdown.
CHILD = """
import os, signal, sys
from celery.signals import worker_ready

out = sys.argv[1]

@worker_ready.connect
def _dump(sender=None, **kwargs):
    with open(out, "w") as f:
        f.write("\\n".join(sorted(sys.modules)))
    os.kill(os.getpid(), signal.SIGTERM)

from celery.bin.celery import main
sys.argv = ["celery", "-A", "example_project.app", "worker", "-c", "1", "-l", "WARNING"]
main()
"""


def module_lines(name: str) -> int:
    """Lines of the source file of module ``name`` of the checkout (0 when it has none)."""
    parts = name.split(".")
    path = ROOT.joinpath(*parts)
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return len(candidate.read_text(encoding="utf-8").splitlines())
    return 0


def package_lines(package: str = PACKAGE) -> int:
    """Lines of every module of ``package`` (``find celery_dlx -name '*.py' | xargs cat | wc -l``)."""
    return sum(
        len(p.read_text(encoding="utf-8").splitlines()) for p in (ROOT / package).rglob("*.py")
    )


def of_package(names: list[str], package: str) -> list[str]:
    """The names of ``names`` that are ``package`` or one of its modules."""
    return [n for n in names if n == package or n.startswith(package + ".")]


def loaded_by_worker(run: str) -> list[str]:
    """Names of the modules loaded when the example worker of ``run`` is ready."""
    env = {**os.environ, "EXAMPLE_RUN": run, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "modules.txt"
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(out)],
            cwd=ROOT,
            env=env,
            timeout=READY_TIMEOUT,
            capture_output=True,
            text=True,
            check=False,
        )
        if not out.exists():
            sys.stderr.write(proc.stdout + proc.stderr)
            raise SystemExit(f"the worker never became ready (exit status {proc.returncode})")
        return out.read_text().split()


def clean_up(run: str) -> None:
    """Delete the queues, exchanges and Redis keys the example worker of ``run`` made."""
    env = {**os.environ, "EXAMPLE_RUN": run, "PYTHONPATH": str(ROOT)}
    code = (
        "from example_project import app as m\n"
        "with m.app.connection_for_write() as conn:\n"
        "    ch = conn.default_channel\n"
        "    for q in (m.ORDERS, m.SHIPPING, m.FULFILMENT, m.DEAD):\n"
        "        ch.queue_delete(q)\n"
        "    for x in (m.ORDERS, m.SHIPPING, m.DLX_EXCHANGE):\n"
        "        ch.exchange_delete(x)\n"
        "import redis\n"
        "client = redis.Redis.from_url(m.REDIS_URL)\n"
        "for key in client.scan_iter(match='{' + m.RUN + '}:*'):\n"
        "    client.delete(key)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=False, timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", action="store_true", help="list each module loaded")
    args = parser.parse_args()
    run = f"coresize-{uuid.uuid4().hex[:8]}"
    try:
        loaded = loaded_by_worker(run)
    finally:
        clean_up(run)
    sizes = {name: module_lines(name) for name in of_package(loaded, PACKAGE)}
    if args.modules:
        for name, lines in sorted(sizes.items()):
            print(f"{lines:6d}  {name}")
    total = package_lines()
    core = sum(sizes.values())
    print(f"celery_dlx: {total} lines in all")
    print(
        f"core (loaded by a ready worker): {len(sizes)} modules, {core} lines ({core / total:.0%})"
    )
    for product in PRODUCTS:
        print(
            f"{product}: {package_lines(product)} lines, "
            f"{len(of_package(loaded, product))} modules loaded by the worker"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
