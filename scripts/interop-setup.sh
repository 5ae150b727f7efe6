#!/usr/bin/env bash
# The foreign AMQP clients of tests/interop: Go (amqp091-go), Node (amqplib), Ruby (bunny).
# Debian packages through apt-get, amqplib through `npm ci` into tests/interop/node/node_modules.
# Idempotent and quick when everything is present. A client that cannot be installed (no apt,
# no network) is a warning here; its tests then skip with the reason, except under CI=1, where
# this script fails instead.
set -euo pipefail
cd "$(dirname "$0")/.."

warn() {
  echo "interop-setup: $*" >&2
  if [ -n "${CI:-}" ]; then exit 1; fi
}

need=()
command -v go >/dev/null 2>&1 || need+=(golang-go)
[ -d /usr/share/gocode/src/github.com/rabbitmq/amqp091-go ] ||
  need+=(golang-github-rabbitmq-amqp091-go-dev)
ruby -e 'require "bunny"' >/dev/null 2>&1 || need+=(ruby-bunny)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if command -v apt-get >/dev/null 2>&1; then
    echo "interop-setup: apt-get install ${need[*]}"
    { $sudo apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends \
        "${need[@]}" >/dev/null; } || warn "apt-get could not install ${need[*]}"
  else
    warn "no apt-get: install ${need[*]} yourself for tests/interop"
  fi
fi

node_dir=tests/interop/node
if command -v npm >/dev/null 2>&1; then
  stamp="$node_dir/node_modules/.celery_dlx-lock"
  want=$(sha1sum "$node_dir/package-lock.json" | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    if (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error); then
      echo "$want" >"$stamp"
    else
      warn "npm ci failed in $node_dir"
    fi
  fi
fi
