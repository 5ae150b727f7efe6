#!/usr/bin/env bash
# Create .venv-lowest: celery_dlx with the lowest releases setup.cfg allows
# (tests/constraints/lowest.txt) on the lowest Python it claims, 3.10 (skipped when nothing in
# setup.cfg, pyproject.toml or the constraints changed since the last install).
# The Python: $PYTHON_LOWEST, else python3.10 on PATH, else pyenv's 3.10 (installed with
# `pyenv install` when pyenv has none).
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  if [ -n "${PYTHON_LOWEST:-}" ]; then echo "$PYTHON_LOWEST"; return; fi
  # (a pyenv shim is on PATH for every version pyenv has, but runs only the active ones)
  if python3.10 -c "" >/dev/null 2>&1; then command -v python3.10; return; fi
  local root="${PYENV_ROOT:-$HOME/.pyenv}" p
  for p in "$root"/versions/3.10*/bin/python; do
    if [ -x "$p" ]; then echo "$p"; return; fi
  done
  if command -v pyenv >/dev/null 2>&1; then
    pyenv install -s 3.10 >&2
    for p in "$root"/versions/3.10*/bin/python; do
      if [ -x "$p" ]; then echo "$p"; return; fi
    done
  fi
  echo "scripts/setup-lowest.sh: no Python 3.10 found: install one (pyenv install 3.10) or set PYTHON_LOWEST" >&2
  return 1
}

if [ ! -x .venv-lowest/bin/python ]; then
  "$(find_python)" -m venv .venv-lowest
fi
stamp=.venv-lowest/.celery_dlx-installed
want=$(cat setup.cfg pyproject.toml tests/requirements.txt tests/constraints/lowest.txt | sha1sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv-lowest/bin/python -m pip install -q --upgrade pip setuptools wheel
  # PIP_CONSTRAINT, not -c: it holds for the build of the editable install too.
  PIP_CONSTRAINT="$PWD/tests/constraints/lowest.txt" \
    .venv-lowest/bin/python -m pip install -q -e ".[sentry,protobuf,flower,web]" \
      -r tests/requirements.txt
  echo "$want" > "$stamp"
fi
