#!/usr/bin/env bash
# The whole check on a fresh machine: services, virtualenv, lint, type check, the documentation
# site, every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-services.sh
bash scripts/setup.sh
echo "== ruff"; .venv/bin/ruff check celery_dlx celery_dlx_spark tests benchmarks example_project
.venv/bin/ruff format --check celery_dlx celery_dlx_spark tests benchmarks example_project
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
exec .venv/bin/pytest -q -n "$PROCESSES" --dist loadfile "$@"
