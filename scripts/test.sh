#!/usr/bin/env bash
# The whole check on a fresh machine: services, virtualenvs, lint, type check, the documentation
# site, every test on the newest releases, and the unit and core integration tests on the lowest
# releases setup.cfg allows.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-services.sh
bash scripts/setup.sh
LOWEST="${DLX_TEST_LOWEST:-1}"
if [ "$LOWEST" != 0 ]; then bash scripts/setup-lowest.sh; fi
echo "== ruff"; .venv/bin/ruff check celery_dlx celery_dlx_console celery_dlx_edit celery_dlx_spark tests benchmarks example_project
.venv/bin/ruff format --check celery_dlx celery_dlx_console celery_dlx_edit celery_dlx_spark tests benchmarks example_project
echo "== mypy"; .venv/bin/mypy
echo "== import contract"; .venv/bin/lint-imports
echo "== docs"; bash scripts/docs.sh
# Celery's own test_tasks.py and test_group_chains.py through the compatibility gate (tests/compat).
export DLX_COMPAT="${DLX_COMPAT:-1}"
# Two test processes (pytest-xdist), a file per process at a time: most of a test's time is spent
# waiting on RabbitMQ, Redis, Spark or a subprocess, and every test uses its own names, vhost, key
# prefix and ports, so two run side by side as two whole suites do (scripts/parallel-suite.sh).
# DLX_TEST_PROCESSES=0 runs them in this process, one after another.
PROCESSES="${DLX_TEST_PROCESSES:-2}"
echo "== pytest ($PROCESSES processes)"
status=0
.venv/bin/pytest -q -n "$PROCESSES" --dist loadfile "$@" || status=$?
# The lowest releases setup.cfg allows, on Python 3.10 (.venv-lowest, tests/constraints/lowest.txt):
# the unit suite and the core integration tests (tests/core_integration.txt), a few minutes.
# DLX_TEST_LOWEST=0 leaves them out; the whole version matrix is `bash scripts/test-matrix.sh`.
if [ "$LOWEST" != 0 ]; then
  echo "== pytest, lowest releases ($PROCESSES processes)"
  .venv-lowest/bin/pytest -q -n "$PROCESSES" --dist loadfile tests/unit @tests/core_integration.txt \
    || status=$?
fi
exit "$status"
