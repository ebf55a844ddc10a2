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
#   HANDOFF_REGISTRY_WATCH_PID  if set, start also leaves a watchdog that
#                               stops the registry once that process exits
#                               (the e2e tests set it).
set -euo pipefail

READY_TIMEOUT=30 # seconds
log() { echo "registry.sh: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}
usage() { die "usage: $0 start DIR [PORT] | stop DIR"; }

[ $# -ge 2 ] || usage
cmd=$1
DIR=$(realpath -m "$2")
PORT=${3:-25000}
if ! [[ "$PORT" =~ ^[0-9]+$ ]] || [ "$PORT" -lt 1 ] || [ "$PORT" -gt 65535 ]; then
  die "PORT $PORT: want a number from 1 to 65535"
fi

# running succeeds when the registry recorded in DIR/pid is alive.
running() {
  [ -f "$DIR/pid" ] && kill -0 "$(<"$DIR/pid")" 2>/dev/null
}

case "$cmd" in
start)
  if running; then
    cat "$DIR/addr"
    exit 0
  fi
  if ! command -v docker-registry >/dev/null; then
    log "installing docker-registry from Debian"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-registry >&2 ||
      die "apt-get install docker-registry failed"
  fi
  mkdir -p "$DIR/data"
  addr=127.0.0.1:$PORT
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
  echo "$addr" >"$DIR/addr"
  for _ in $(seq $((READY_TIMEOUT * 5))); do
    if curl -fsS -o /dev/null --max-time 1 "http://$addr/v2/" 2>/dev/null; then
      if [ -n "${HANDOFF_REGISTRY_WATCH_PID:-}" ]; then
        [[ "$HANDOFF_REGISTRY_WATCH_PID" =~ ^[0-9]+$ ]] || die "HANDOFF_REGISTRY_WATCH_PID $HANDOFF_REGISTRY_WATCH_PID: want a process id"
        setsid -f bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; kill "$2" 2>/dev/null' \
          watchdog "$HANDOFF_REGISTRY_WATCH_PID" "$(<"$DIR/pid")" </dev/null >/dev/null 2>&1
      fi
      log "docker-registry on http://$addr, storage $DIR/data"
      echo "$addr"
      exit 0
    fi
    running || break
    sleep 0.2
  done
  tail -n 20 "$DIR/registry.log" >&2 || true
  "$0" stop "$DIR" || true
  die "the registry did not answer on http://$addr/v2/ within ${READY_TIMEOUT}s (log above; is the port taken?)"
  ;;
stop)
  running || exit 0
  pid=$(<"$DIR/pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$DIR/pid"
  ;;
*) usage ;;
esac
