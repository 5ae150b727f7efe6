#!/usr/bin/env bash
# Set up and run the example project: a worker with beat and the DLX service, a publisher sending
# good, flaky and poison messages, and each message's fate printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-services.sh
bash scripts/setup.sh
exec .venv/bin/python -m example_project.demo "$@"
