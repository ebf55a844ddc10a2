#!/usr/bin/env bash
# Runs a throwaway PostgreSQL for tests and demos: trust auth, fsync off,
# listening on 127.0.0.1 only, everything (data, socket, log) inside DIR.
#
# Usage:
#   hack/postgres.sh start DIR [PORT]   # PORT defaults to 55432
#   hack/postgres.sh stop DIR
#
# start initialises DIR/data if needed, starts the server, waits until it
# accepts connections (at most 30 s) and prints its URL on stdout:
#   postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable
# It is idempotent: if the server in DIR already runs it prints its URL.
# stop shuts the server down (pg_ctl -m fast); stopping a stopped server is
# not an error. Everything but the URL goes to stderr.
#
# PostgreSQL refuses to run as root, so as root the server runs as the
# "postgres" OS user and DIR is chowned to it. If no PostgreSQL is installed
# it is installed with apt-get.
#
# Environment:
#   HANDOFF_PG_LISTEN     more addresses to listen on (comma-separated, e.g. a
#                         bridge address pods reach), each trusted for its /24;
#                         read when DIR is initialised.
#   HANDOFF_PG_WATCH_PID  if set, start also leaves a watchdog that stops the
#                         server once that process exits (used by
#                         internal/pgtest, so an interrupted test binary does
#                         not leak a server).
set -euo pipefail

DEFAULT_PORT=55432
READY_TIMEOUT=30 # seconds

log() { echo "postgres.sh: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}
usage() { die "usage: $0 start DIR [PORT] | stop DIR"; }

# bindir prints the directory of the newest installed PostgreSQL's binaries.
bindir() {
  local d
  if command -v pg_config >/dev/null 2>&1; then
    d=$(pg_config --bindir 2>/dev/null || true)
    if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
      echo "$d"
      return
    fi
  fi
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5n | tail -n1 || true)
  if [ -n "$d" ] && [ -x "$d/initdb" ]; then
    echo "$d"
    return
  fi
  return 1
}

# ensure_postgres sets BIN, installing PostgreSQL with apt-get if missing.
ensure_postgres() {
  if BIN=$(bindir); then return; fi
  command -v apt-get >/dev/null 2>&1 || die "PostgreSQL is not installed and apt-get is not available; install PostgreSQL 15 or newer"
  log "PostgreSQL not found; installing it with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update >&2 || die "apt-get update failed"
  apt-get install -y postgresql >&2 || die "apt-get install postgresql failed"
  BIN=$(bindir) || die "PostgreSQL was installed but initdb/pg_ctl are not found"
}

# as_pg runs a command as the user that owns the server, from inside DIR (so
# it never starts in a directory that user cannot read).
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    (cd "$DIR" && runuser -u postgres -- "$@")
  else
    (cd "$DIR" && "$@")
  fi
}

# running succeeds when the postmaster of DIR/data is alive.
running() {
  [ -f "$DATA/postmaster.pid" ] && as_pg "$BIN/pg_ctl" status -D "$DATA" >/dev/null 2>&1
}

# url prints the connection URL for the server listening on port $1.
url() { echo "postgres://postgres@127.0.0.1:$1/postgres?sslmode=disable"; }

start() {
  local port=$1
  [[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die "PORT $port: want a number from 1 to 65535"
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd)
  DATA=$DIR/data
  # A unix socket path is limited to 107 bytes.
  [ ${#DIR} -le 90 ] || die "DIR $DIR is too long for a unix socket path; use a shorter one"
  ensure_postgres

  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || die "running as root needs the OS user \"postgres\" to run the server"
    chown postgres: "$DIR"
    [ -d "$DATA" ] && chown -R postgres: "$DATA"
    runuser -u postgres -- test -w "$DIR" ||
      die "the postgres user cannot reach $DIR (a parent directory is private?); use a directory under /tmp"
  fi

  if running; then
    # The port the running server listens on is line 4 of postmaster.pid.
    local have
    have=$(sed -n 4p "$DATA/postmaster.pid")
    [ "$have" = "$port" ] || log "already running on port $have (not $port)"
    log "already running in $DIR"
    url "$have"
    return
  fi

  if [ ! -f "$DATA/PG_VERSION" ]; then
    log "initialising $DATA with $BIN/initdb"
    # initdb's report (about 20 lines) goes to a file, shown only if it
    # fails: it is not the caller's to read (it landed in the demo's
    # timeline).
    if ! as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --locale=C --no-sync --no-instructions >"$DIR/initdb.log" 2>&1; then
      cat "$DIR/initdb.log" >&2
      die "initdb failed; its output above, and in $DIR/initdb.log"
    fi
    # Settings that never change for this server. The port is given at each
    # start instead, so one DIR can be restarted on another port.
    cat >>"$DATA/postgresql.conf" <<EOF

# hack/postgres.sh: throwaway server, durability off.
listen_addresses = '127.0.0.1${HANDOFF_PG_LISTEN:+,$HANDOFF_PG_LISTEN}'
unix_socket_directories = '$DIR'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 200
EOF
    listen=${HANDOFF_PG_LISTEN:-}
    for a in ${listen//,/ }; do
      echo "host all all ${a%.*}.0/24 trust" >>"$DATA/pg_hba.conf"
    done
  fi

  log "starting PostgreSQL $("$BIN/postgres" --version | awk '{print $3}') in $DIR on 127.0.0.1:$port"
  # pg_ctl -w waits for the server and notices if it dies while starting
  # (port in use, bad setting, ...).
  if ! as_pg "$BIN/pg_ctl" start -D "$DATA" -l "$DIR/postgres.log" -o "-p $port" -w -t "$READY_TIMEOUT" >"$DIR/pg_ctl.log" 2>&1; then
    cat "$DIR/pg_ctl.log" >&2 || true
    tail -n 20 "$DIR/postgres.log" >&2 || true
    die "PostgreSQL did not start (port $port in use? not ready within ${READY_TIMEOUT}s?); log: $DIR/postgres.log"
  fi
  # Then check the socket inside DIR: a server of someone else on the same
  # TCP port must not pass for ours.
  local deadline=$((SECONDS + READY_TIMEOUT))
  until as_pg "$BIN/pg_isready" -q -h "$DIR" -p "$port" -U postgres; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 20 "$DIR/postgres.log" >&2 || true
      die "PostgreSQL not ready after ${READY_TIMEOUT}s; log: $DIR/postgres.log"
    fi
    sleep 0.1
  done
  "$BIN/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres ||
    die "PostgreSQL accepts connections on its socket but not on 127.0.0.1:$port"

  if [ -n "${HANDOFF_PG_WATCH_PID:-}" ]; then
    watch "$HANDOFF_PG_WATCH_PID"
  fi
  url "$port"
}

# watch leaves a process that stops the server once process $1 is gone. It
# runs in a session of its own, so the signal that kills a process group
# (^C, timeout) does not kill it too, and writes to DIR/watchdog.log, so
# whoever reads our output is not kept waiting for it.
watch() {
  local pid=$1
  [[ "$pid" =~ ^[0-9]+$ ]] || die "HANDOFF_PG_WATCH_PID $pid: want a process id"
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
  DATA=$DIR/data
  if [ ! -d "$DATA" ]; then
    log "nothing to stop in $DIR"
    return
  fi
  DIR=$(cd "$DIR" && pwd)
  BIN=$(bindir) || die "PostgreSQL binaries not found"
  if ! running; then
    log "not running in $DIR"
    return
  fi
  as_pg "$BIN/pg_ctl" stop -D "$DATA" -m fast -w -t "$READY_TIMEOUT" >&2 || die "pg_ctl stop failed"
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
