#!/usr/bin/env bash
# Make sure RabbitMQ (127.0.0.1:5672, guest/guest), Redis (127.0.0.1:6379) and Java 17 (for the
# Spark exporter) are there: install them from Debian's packages if missing, start them if stopped.
# Never stops, flushes or reconfigures a server that is already running.
set -euo pipefail

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=""
apt_install() {
  if [ -z "$apt_updated" ]; then as_root apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

if ! up 6379; then
  command -v redis-server >/dev/null || { echo "installing redis-server"; apt_install redis-server; }
  echo "starting redis-server"
  as_root mkdir -p /var/lib/redis /var/log/redis
  as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 50); do up 6379 && break; sleep 0.2; done
fi

if ! up 5672; then
  command -v rabbitmq-server >/dev/null || { echo "installing rabbitmq-server"; apt_install rabbitmq-server; }
  echo "starting rabbitmq-server"
  as_root rabbitmq-server -detached
  as_root timeout 120 rabbitmqctl await_startup >/dev/null
fi

# The management API lets `celery dlx migrate --policy` and `celery dlx check` read queues and add
# policies; enabling it on a running node needs no restart.
if ! up 15672; then
  as_root rabbitmq-plugins enable --online rabbitmq_management >/dev/null 2>&1 || \
    as_root rabbitmq-plugins enable rabbitmq_management >/dev/null 2>&1 || true
  for _ in $(seq 50); do up 15672 && break; sleep 0.2; done
fi

if ! command -v java >/dev/null || ! java -version 2>&1 | grep -qE 'version "(17|21)'; then
  echo "installing Java 17 for the Spark exporter"
  apt_install openjdk-17-jre-headless
fi

up 6379 || { echo "Redis is not answering on 127.0.0.1:6379" >&2; exit 1; }
up 5672 || { echo "RabbitMQ is not answering on 127.0.0.1:5672" >&2; exit 1; }
