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
#   HANDOFF_REDIS_WATCH_PID  if set, start also leaves a watchdog that stops
#                            the server once that process exits (used by
#                            internal/redistest, so an interrupted test
#                            binary does not leak a server).
set -euo pipefail

DEFAULT_PORT=56379
READY_TIMEOUT=30 # seconds

log() { echo "redis.sh: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}
usage() { die "usage: $0 start DIR [PORT] | stop DIR"; }

# ensure_redis installs redis-server with apt-get if missing.
ensure_redis() {
  if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then return; fi
  command -v apt-get >/dev/null 2>&1 || die "redis-server is not installed and apt-get is not available; install Redis 6.2 or newer"
  log "redis-server not found; installing it with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update >&2 || die "apt-get update failed"
  apt-get install -y -o DPkg::Lock::Timeout=600 redis-server >&2 || die "apt-get install redis-server failed"
  command -v redis-server >/dev/null 2>&1 || die "redis-server was installed but is not on PATH"
}

# running succeeds when the server of DIR is alive.
running() {
  [ -f "$DIR/redis.pid" ] && kill -0 "$(cat "$DIR/redis.pid")" 2>/dev/null
}

start() {
  local port=$1
  if ! [[ "$port" =~ ^[0-9]+$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
    die "PORT $port: want a number from 1 to 65535"
  fi
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd)
  ensure_redis

  if running; then
    local have
    have=$(cat "$DIR/port")
    [ "$have" = "$port" ] || log "already running on port $have (not $port)"
    log "already running in $DIR"
    echo "127.0.0.1:$have"
    return
  fi

  log "starting $(redis-server --version | awk '{print $1, $2, $3}') in $DIR on 127.0.0.1:$port"
  echo "$port" >"$DIR/port"
  # No RDB snapshots, no AOF: a throwaway server. --daemonize writes the pid
  # file once the server listens.
  redis-server --bind 127.0.0.1 --port "$port" --dir "$DIR" --save "" --appendonly no \
    --daemonize yes --pidfile "$DIR/redis.pid" --logfile "$DIR/redis.log" >&2 ||
    die "redis-server did not start; log: $DIR/redis.log"
  local deadline=$((SECONDS + READY_TIMEOUT))
  until running && [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = PONG ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 20 "$DIR/redis.log" >&2 || true
      die "Redis not ready after ${READY_TIMEOUT}s (port $port in use?); log: $DIR/redis.log"
    fi
    sleep 0.05
  done

  if [ -n "${HANDOFF_REDIS_WATCH_PID:-}" ]; then
    watch "$HANDOFF_REDIS_WATCH_PID"
  fi
  echo "127.0.0.1:$port"
}

# watch leaves a process that stops the server once process $1 is gone, in a
# session of its own (so the signal that kills a process group does not kill
# it too), writing to DIR/watchdog.log.
watch() {
  local pid=$1
  [[ "$pid" =~ ^[0-9]+$ ]] || die "HANDOFF_REDIS_WATCH_PID $pid: want a process id"
  log "will stop the server when process $pid exits"
  setsid -f bash "$SELF" _watchdog "$DIR" "$pid" </dev/null >>"$DIR/watchdog.log" 2>&1
}

# watchdog is the process watch leaves behind.
watchdog() {
  local pid=$1
  while kill -0 "$pid" 2>/dev/null; do sleep 1; done
  log "process $pid is gone; stopping the server"
  stop
}

stop() {
  if [ ! -d "$DIR" ] || ! running; then
    log "not running in $DIR"
    return
  fi
  local pid
  pid=$(cat "$DIR/redis.pid")
  redis-cli -h 127.0.0.1 -p "$(cat "$DIR/port")" shutdown nosave >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + READY_TIMEOUT))
  while kill -0 "$pid" 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || die "redis-server $pid did not stop within ${READY_TIMEOUT}s"
    sleep 0.05
  done
}

SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
cmd=${1:-}
DIR=${2:-}
[ -n "$DIR" ] || usage
case "$cmd" in
  start) start "${3:-$DEFAULT_PORT}" ;;
  stop) stop ;;
  _watchdog) watchdog "${3:?}" ;;
  *) usage ;;
esac
