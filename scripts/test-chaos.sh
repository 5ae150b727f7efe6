#!/usr/bin/env bash
# The failure storm and the multi-process chaos test, about 3 minutes: 2,500 poison
# tasks filling a private Redis at its maxmemory; then three prefork workers, a separate DLX
# service, a drain and a foreign consumer under kill -9, Redis kill -9 with AOF, a private
# RabbitMQ 3.10 node stopped and started (on free ports, stopped by node name after), every crash
# point armed, three seeds. Needs the shared Redis (the tasks' ledgers); extra pytest arguments are
# passed on.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-services.sh
[ -x .venv/bin/pytest ] || bash scripts/setup.sh
export DLX_CHAOS_MULTI=1
exec .venv/bin/pytest -q -s -p no:randomly tests/chaos/test_storm.py \
  tests/chaos/test_multiprocess_chaos.py "$@"
