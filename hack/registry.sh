#!/usr/bin/env bash
# Runs a throwaway OCI registry on loopback for release builds and the e2e
# tests: Debian's docker-registry (the CNCF distribution registry, 2.8),
# plain HTTP on 127.0.0.1 only, its storage and log inside DIR.
#
# Usage:
#   hack/registry.sh start DIR [PORT]   # PORT defaults to 25000
#   hack/registry.sh stop DIR
#
# start writes DIR/config.yml, starts the registry, waits until it answers
# GET /v2/ (at most 30 s) and prints its address on stdout, 127.0.0.1:PORT.
# If the registry of DIR already runs it prints the address again. stop
# ends it (SIGTERM, then SIGKILL after 10 s); stopping a stopped registry is
# not an error. Everything but the address goes to stderr. If docker-registry
# is not installed it is installed with apt-get.
#
# The default port is below Linux's ephemeral range (32768-60999), so no
# outgoing connection holds it when the registry binds.
#
# Environment:
#   HANDOFF_WATCH_PID  if set, start also leaves a watchdog that stops the
#                      registry once that process exits (hack/lib/server.sh;
#                      the e2e tests set it).
set -euo pipefail

NAME=registry.sh
DEFAULT_PORT=25000
READY_TIMEOUT=30 # seconds

# server_prepare installs docker-registry with apt-get if missing.
server_prepare() {
  command -v docker-registry >/dev/null && return
  log "installing docker-registry from Debian"
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-registry >&2 ||
    die "apt-get install docker-registry failed"
}

# server_running succeeds when the registry recorded in DIR/pid is alive.
server_running() {
  [ -f "$DIR/pid" ] && kill -0 "$(<"$DIR/pid")" 2>/dev/null
}

server_port() { cat "$DIR/port"; }

server_addr() { echo "127.0.0.1:$1"; }

server_start() {
  local port=$1 addr=127.0.0.1:$1
  mkdir -p "$DIR/data"
  cat >"$DIR/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog: {disabled: true}
storage:
  filesystem: {rootdirectory: $DIR/data}
  delete: {enabled: true}
http:
  addr: $addr
EOF
  # setsid: the signal that stops the caller's process group (^C) must not
  # leave it half-stopped; stop and the watchdog end it by PID.
  setsid docker-registry serve "$DIR/config.yml" >"$DIR/registry.log" 2>&1 </dev/null &
  echo $! >"$DIR/pid"
  echo "$port" >"$DIR/port"
  for _ in $(seq $((READY_TIMEOUT * 5))); do
    if curl -fsS -o /dev/null --max-time 1 "http://$addr/v2/" 2>/dev/null; then
      log "docker-registry on http://$addr, storage $DIR/data"
      return
    fi
    server_running || break
    sleep 0.2
  done
  tail -n 20 "$DIR/registry.log" >&2 || true
  server_running && server_stop
  die "the registry did not answer on http://$addr/v2/ within ${READY_TIMEOUT}s (log above; is the port taken?)"
}

# server_stop ends the registry: SIGTERM, then SIGKILL after 10 s.
server_stop() {
  local pid
  pid=$(<"$DIR/pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$DIR/pid"
}

source "$(dirname "${BASH_SOURCE[0]}")/lib/server.sh"
server_main "$@"
