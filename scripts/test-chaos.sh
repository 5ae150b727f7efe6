#!/usr/bin/env bash
# The multi-process chaos test (issue 36): three prefork workers, a separate DLX service, a drain
# and a foreign consumer under kill -9, Redis kill -9 with AOF, a private RabbitMQ 3.10 node
# stopped and started (on free ports, stopped by node name after), every crash point armed, three
# seeds; ~2 minutes a seed. Needs the shared Redis (the tasks' ledger); extra pytest arguments are
# passed on.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-services.sh
[ -x .venv/bin/pytest ] || bash scripts/setup.sh
export DLX_CHAOS_MULTI=1
exec .venv/bin/pytest -q -s -p no:randomly tests/chaos/test_multiprocess_chaos.py "$@"
