#!/usr/bin/env bash
# Runs a throwaway Redis for tests and demos: no persistence, listening on
# 127.0.0.1 only, everything (pid file, log) inside DIR.
#
# Usage:
#   hack/redis.sh start DIR [PORT]   # PORT defaults to 56379
#   hack/redis.sh stop DIR
#
# start starts the server, waits until it answers PING (at most 30 s) and
# prints its address on stdout, like 127.0.0.1:56379. It is idempotent: if
# the server in DIR already runs it prints its address. stop shuts the
# server down (SHUTDOWN NOSAVE); stopping a stopped server is not an error.
# Everything but the address goes to stderr.
#
# If no redis-server is installed it is installed with apt-get (Debian's
# redis-server; Streams consumer groups need 5.0, XAUTOCLAIM 6.2).
#
# Environment:
#   HANDOFF_WATCH_PID  if set, start also leaves a watchdog that stops the
#                      server once that process exits (hack/lib/server.sh).
set -euo pipefail

NAME=redis.sh
DEFAULT_PORT=56379
READY_TIMEOUT=30 # seconds

# server_prepare installs redis-server with apt-get if missing.
server_prepare() {
  if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then return; fi
  command -v apt-get >/dev/null 2>&1 || die "redis-server is not installed and apt-get is not available; install Redis 6.2 or newer"
  log "redis-server not found; installing it with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update >&2 || die "apt-get update failed"
  apt-get install -y -o DPkg::Lock::Timeout=600 redis-server >&2 || die "apt-get install redis-server failed"
  command -v redis-server >/dev/null 2>&1 || die "redis-server was installed but is not on PATH"
}

# server_running succeeds when the server of DIR is alive.
server_running() {
  [ -f "$DIR/redis.pid" ] && kill -0 "$(cat "$DIR/redis.pid")" 2>/dev/null
}

server_port() { cat "$DIR/port"; }

server_addr() { echo "127.0.0.1:$1"; }

server_start() {
  local port=$1
  log "starting $(redis-server --version | awk '{print $1, $2, $3}') in $DIR on 127.0.0.1:$port"
  echo "$port" >"$DIR/port"
  # No RDB snapshots, no AOF: a throwaway server. --daemonize writes the pid
  # file once the server listens.
  redis-server --bind 127.0.0.1 --port "$port" --dir "$DIR" --save "" --appendonly no \
    --daemonize yes --pidfile "$DIR/redis.pid" --logfile "$DIR/redis.log" >&2 ||
    die "redis-server did not start; log: $DIR/redis.log"
  local deadline=$((SECONDS + READY_TIMEOUT))
  until server_running && [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = PONG ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 20 "$DIR/redis.log" >&2 || true
      die "Redis not ready after ${READY_TIMEOUT}s (port $port in use?); log: $DIR/redis.log"
    fi
    sleep 0.05
  done
}

server_stop() {
  local pid
  pid=$(cat "$DIR/redis.pid")
  redis-cli -h 127.0.0.1 -p "$(cat "$DIR/port")" shutdown nosave >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + READY_TIMEOUT))
  while kill -0 "$pid" 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || die "redis-server $pid did not stop within ${READY_TIMEOUT}s"
    sleep 0.05
  done
}

source "$(dirname "${BASH_SOURCE[0]}")/lib/server.sh"
server_main "$@"
