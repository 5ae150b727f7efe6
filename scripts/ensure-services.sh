#!/usr/bin/env bash
# Make sure RabbitMQ (127.0.0.1:5672, guest/guest), Redis (127.0.0.1:6379) and Java 17 (for the
# Spark exporter) are there: install them from Debian's packages if missing, start them if stopped.
# Never stops, flushes or reconfigures a server that is already running.
# DLX_REDIS_PORT, DLX_AMQP_PORT, DLX_MANAGEMENT_PORT: other ports (tests run the script against
# fake servers on free ports); DLX_RABBITMQ_WAIT: seconds to wait for a starting node (180).
set -euo pipefail

REDIS_PORT="${DLX_REDIS_PORT:-6379}"
AMQP_PORT="${DLX_AMQP_PORT:-5672}"
MANAGEMENT_PORT="${DLX_MANAGEMENT_PORT:-15672}"
RABBITMQ_WAIT="${DLX_RABBITMQ_WAIT:-180}"

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=""
apt_install() {
  if [ -z "$apt_updated" ]; then as_root apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

# `rabbitmqctl await_startup` exits 69 ("node not running at all") until a node started with
# -detached has registered with epmd, which takes seconds: ask again until the deadline.
await_rabbitmq() {
  local deadline=$((SECONDS + RABBITMQ_WAIT)) code
  while true; do
    code=0
    as_root rabbitmqctl await_startup --timeout 30 >/dev/null 2>&1 || code=$?
    if [ "$code" = 0 ] && up "$AMQP_PORT"; then return 0; fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "RabbitMQ did not start within ${RABBITMQ_WAIT}s (rabbitmqctl await_startup: exit $code)" >&2
      return 1
    fi
    sleep 2
  done
}

if ! up "$REDIS_PORT"; then
  command -v redis-server >/dev/null || { echo "installing redis-server"; apt_install redis-server; }
  echo "starting redis-server"
  as_root mkdir -p /var/lib/redis /var/log/redis
  as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" \
    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 50); do up "$REDIS_PORT" && break; sleep 0.2; done
fi

if ! up "$AMQP_PORT"; then
  command -v rabbitmq-server >/dev/null || { echo "installing rabbitmq-server"; apt_install rabbitmq-server; }
  echo "starting rabbitmq-server"
  as_root rabbitmq-server -detached
  await_rabbitmq
fi

# The management API lets `celery dlx migrate --policy` and `celery dlx check` read queues and add
# policies; enabling it on a running node needs no restart.
if ! up "$MANAGEMENT_PORT"; then
  as_root rabbitmq-plugins enable --online rabbitmq_management >/dev/null 2>&1 || \
    as_root rabbitmq-plugins enable rabbitmq_management >/dev/null 2>&1 || true
  for _ in $(seq 50); do up "$MANAGEMENT_PORT" && break; sleep 0.2; done
fi

if ! command -v java >/dev/null || ! java -version 2>&1 | grep -qE 'version "(17|21)'; then
  echo "installing Java 17 for the Spark exporter"
  apt_install openjdk-17-jre-headless
fi

up "$REDIS_PORT" || { echo "Redis is not answering on 127.0.0.1:$REDIS_PORT" >&2; exit 1; }
up "$AMQP_PORT" || { echo "RabbitMQ is not answering on 127.0.0.1:$AMQP_PORT" >&2; exit 1; }
