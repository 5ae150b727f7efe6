#!/usr/bin/env bash
# The whole check on a fresh machine: services, virtualenv, lint, type check, every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-services.sh
bash scripts/setup.sh
echo "== ruff"; .venv/bin/ruff check celery_dlx celery_dlx_spark tests benchmarks example_project
.venv/bin/ruff format --check celery_dlx celery_dlx_spark tests benchmarks example_project
echo "== mypy"; .venv/bin/mypy
echo "== import contract"; .venv/bin/lint-imports
# Celery's own test_tasks.py and test_group_chains.py through the compatibility gate (tests/compat).
export DLX_COMPAT="${DLX_COMPAT:-1}"
echo "== pytest"; exec .venv/bin/pytest -q "$@"
