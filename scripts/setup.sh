#!/usr/bin/env bash
# Create .venv and install celery_dlx with every extra, the test tools (tests/requirements.txt),
# the benchmarks' (benchmarks/requirements.txt) and what building the documentation site needs
# (docs/requirements.txt: not a package extra, users never build the docs); skipped when none of
# those files changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.celery_dlx-installed
want=$(cat setup.cfg pyproject.toml tests/requirements.txt benchmarks/requirements.txt docs/requirements.txt | sha1sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip setuptools wheel
  .venv/bin/python -m pip install -q -e ".[sentry,protobuf,spark,flower,web]" \
    -r tests/requirements.txt -r benchmarks/requirements.txt -r docs/requirements.txt
  echo "$want" > "$stamp"
fi
# The console's browser tests drive Debian's Chromium through Playwright (no browser download).
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium
fi
# The foreign AMQP clients (Go, Node, Ruby) of tests/interop.
bash scripts/interop-setup.sh
