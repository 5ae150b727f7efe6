#!/usr/bin/env bash
# The version matrix (tox.ini's `matrix` label; docs/compatibility.md): each supported Celery
# minor with its kombu, the lowest and newest redis-py, py-amqp and extras, Python 3.10 to 3.13,
# and the newest releases there are (the early warning). Each environment runs the unit suite and
# the core integration tests (tests/core_integration.txt) in a virtualenv of its own under .tox/.
# Arguments go to tox: `bash scripts/test-matrix.sh -e lowest,newest`, `... -- -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-services.sh
if [ ! -x .venv-tox/bin/tox ]; then
  python3 -m venv .venv-tox
  .venv-tox/bin/python -m pip install -q "tox>=4.11"
fi
# tox finds each environment's Python (python3.10 ... python3.13) on PATH: put pyenv's first
# where none runs (a pyenv shim is on PATH for every version pyenv has, but runs only the active
# ones).
root="${PYENV_ROOT:-$HOME/.pyenv}"
for minor in 3.10 3.11 3.12 3.13; do
  if ! "python$minor" -c "" >/dev/null 2>&1; then
    for p in "$root"/versions/"$minor".*/bin; do
      if [ -x "$p/python$minor" ]; then PATH="$p:$PATH"; break; fi
    done
  fi
done
export PATH
if [ "$#" -gt 0 ] && [ "${1#-e}" != "$1" ]; then
  exec .venv-tox/bin/tox "$@"
fi
exec .venv-tox/bin/tox -m matrix "$@"
