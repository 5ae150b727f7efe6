#!/usr/bin/env bash
# Build the documentation site into build/docs (open build/docs/index.html).
# Warnings are errors (-W) and every cross-reference must resolve (-n): a link to a page or a
# heading that does not exist fails the build. Offline: no external link is fetched. -E: a fresh
# read of every page each time, so no warning hides in a cached page. About 10 s.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python docs/gen_config.py --check
exec .venv/bin/sphinx-build -E -W --keep-going -n -q -b html docs build/docs "$@"
