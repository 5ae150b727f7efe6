#!/usr/bin/env bash
# The RabbitMQ cluster test (issue 24): three private RabbitMQ 3.10 nodes on free ports (stopped
# by node name/PID after), quorum queues, kill -9 of each node in turn; ~5 minutes.
# Needs the shared Redis (the tasks' ledger) and Debian's rabbitmq-server; extra pytest
# arguments are passed on.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/pytest ] || bash scripts/setup.sh
export DLX_CLUSTER=1
exec .venv/bin/pytest -q -s tests/cluster "$@"
