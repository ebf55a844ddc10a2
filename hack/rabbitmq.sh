#!/usr/bin/env bash
# Runs a throwaway RabbitMQ node for tests and demos: listening for AMQP on
# 127.0.0.1 only, everything (Mnesia, logs, cookie, pid file) inside DIR,
# user guest/guest (allowed from loopback only, RabbitMQ's default).
#
# Usage:
#   hack/rabbitmq.sh start DIR [PORT]   # PORT defaults to 56720; PORT+1 is
#                                       # the node's distribution port
#   hack/rabbitmq.sh stop DIR
#
# start starts the node, waits until it accepts AMQP connections (at most
# 120 s; about 7 s here) and prints its URL on stdout:
#   amqp://guest:guest@127.0.0.1:PORT/
# It is idempotent: if the node of DIR already runs it prints its URL. stop
# stops the node (SIGTERM: RabbitMQ shuts down cleanly) and, if no other
# Erlang node is registered with it, the epmd the node started; stopping a
# stopped node is not an error. Everything but the URL goes to stderr.
#
# If RabbitMQ is not installed it is installed with apt-get (Debian's
# rabbitmq-server and Erlang; about 50 s).
#
# Environment:
#   HANDOFF_WATCH_PID  if set, start also leaves a watchdog that stops the
#                      node once that process exits (hack/lib/server.sh).
set -euo pipefail

NAME=rabbitmq.sh
DEFAULT_PORT=56720
MAX_PORT=65534 # PORT+1 is the distribution port
READY_TIMEOUT=120 # seconds
BIN=/usr/lib/rabbitmq/bin

# server_prepare installs rabbitmq-server with apt-get if missing.
server_prepare() {
  if [ -x "$BIN/rabbitmq-server" ]; then return; fi
  command -v apt-get >/dev/null 2>&1 || die "RabbitMQ is not installed and apt-get is not available; install rabbitmq-server 3.10 or newer"
  log "RabbitMQ not found; installing it with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update >&2 || die "apt-get update failed"
  apt-get install -y -o DPkg::Lock::Timeout=600 rabbitmq-server >&2 || die "apt-get install rabbitmq-server failed"
  [ -x "$BIN/rabbitmq-server" ] || die "rabbitmq-server was installed but $BIN/rabbitmq-server is not there"
}

# server_running succeeds when the node of DIR is alive.
server_running() {
  [ -s "$DIR/rabbit.pid" ] && kill -0 "$(cat "$DIR/rabbit.pid")" 2>/dev/null
}

server_port() { cat "$DIR/port"; }

server_addr() { echo "amqp://guest:guest@127.0.0.1:$1/"; }

server_start() {
  local port=$1
  echo "$port" >"$DIR/port"
  printf 'listeners.tcp.1 = 127.0.0.1:%s\n' "$port" >"$DIR/rabbitmq.conf"
  : >"$DIR/enabled_plugins"
  rm -f "$DIR/rabbit.pid"
  log "starting RabbitMQ $(dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null || echo '?') in $DIR on 127.0.0.1:$port"
  # The node writes its (the Erlang VM's) pid to RABBITMQ_PID_FILE as it
  # boots. In a session of its own, so the signal that kills a process
  # group (^C, timeout) does not kill it before its watchdog does.
  (
    cd "$DIR"
    export HOME=$DIR \
      RABBITMQ_NODENAME="handoff$port@localhost" \
      RABBITMQ_DIST_PORT=$((port + 1)) \
      RABBITMQ_MNESIA_BASE="$DIR/mnesia" \
      RABBITMQ_LOG_BASE="$DIR/log" \
      RABBITMQ_ENABLED_PLUGINS_FILE="$DIR/enabled_plugins" \
      RABBITMQ_PID_FILE="$DIR/rabbit.pid" \
      RABBITMQ_CONFIG_FILE="$DIR/rabbitmq" \
      RABBITMQ_ADVANCED_CONFIG_FILE="$DIR/advanced.config"
    setsid -f "$BIN/rabbitmq-server" </dev/null >"$DIR/out.log" 2>&1
  )
  # Ready once it says its boot completed. The port is not probed before:
  # a connect to a port nobody listens on can connect to itself (the local
  # port is picked from the same range) and take the node's port.
  local deadline=$((SECONDS + READY_TIMEOUT))
  until grep -q '^  Starting broker... completed' "$DIR/out.log" 2>/dev/null && server_running; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 20 "$DIR/out.log" >&2 || true
      die "RabbitMQ not ready after ${READY_TIMEOUT}s (port $port or $((port + 1)) in use?); log: $DIR/out.log"
    fi
    if grep -q 'init terminating' "$DIR/out.log" 2>/dev/null; then
      tail -n 5 "$DIR/out.log" >&2 || true
      die "RabbitMQ did not start (port $port or $((port + 1)) in use?); log: $DIR/out.log"
    fi
    sleep 0.1
  done
  (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null || die "RabbitMQ booted but does not accept connections on 127.0.0.1:$port"
}

server_stop() {
  local pid
  pid=$(cat "$DIR/rabbit.pid")
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + READY_TIMEOUT))
  while kill -0 "$pid" 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || die "RabbitMQ $pid did not stop within ${READY_TIMEOUT}s"
    sleep 0.1
  done
}

# server_after_stop: the node started epmd (Erlang's port mapper) if none
# ran; stop it once no node is registered with it.
server_after_stop() {
  local epmd e
  epmd=
  for e in /usr/lib/erlang/erts-*/bin/epmd; do [ -x "$e" ] && epmd=$e; done
  if [ -n "$epmd" ] && "$epmd" -names 2>/dev/null | grep -q '^epmd: up' &&
    ! "$epmd" -names 2>/dev/null | grep -q '^name '; then
    "$epmd" -kill >/dev/null 2>&1 || true
  fi
}

source "$(dirname "${BASH_SOURCE[0]}")/lib/server.sh"
server_main "$@"
