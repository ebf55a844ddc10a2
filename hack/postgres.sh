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
#   HANDOFF_PG_LISTEN  more addresses to listen on (comma-separated, e.g. a
#                      bridge address pods reach), each trusted for its /24;
#                      read when DIR is initialised.
#   HANDOFF_WATCH_PID  if set, start also leaves a watchdog that stops the
#                      server once that process exits (hack/lib/server.sh).
set -euo pipefail

NAME=postgres.sh
DEFAULT_PORT=55432
READY_TIMEOUT=30 # seconds

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

# server_running succeeds when the postmaster of DIR/data is alive.
server_running() {
  [ -f "$DIR/data/postmaster.pid" ] || return 1
  [ -n "${BIN:-}" ] || BIN=$(bindir) || die "PostgreSQL binaries not found"
  as_pg "$BIN/pg_ctl" status -D "$DIR/data" >/dev/null 2>&1
}

# server_port prints the port of the running server: line 4 of
# postmaster.pid.
server_port() { sed -n 4p "$DIR/data/postmaster.pid"; }

# server_addr prints the connection URL for the server listening on port $1.
server_addr() { echo "postgres://postgres@127.0.0.1:$1/postgres?sslmode=disable"; }

server_prepare() {
  # A unix socket path is limited to 107 bytes.
  [ ${#DIR} -le 90 ] || die "DIR $DIR is too long for a unix socket path; use a shorter one"
  ensure_postgres
  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || die "running as root needs the OS user \"postgres\" to run the server"
    chown postgres: "$DIR"
    [ -d "$DIR/data" ] && chown -R postgres: "$DIR/data"
    runuser -u postgres -- test -w "$DIR" ||
      die "the postgres user cannot reach $DIR (a parent directory is private?); use a directory under /tmp"
  fi
}

server_start() {
  local port=$1 DATA=$DIR/data
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
}

server_stop() {
  as_pg "$BIN/pg_ctl" stop -D "$DIR/data" -m fast -w -t "$READY_TIMEOUT" >&2 || die "pg_ctl stop failed"
}

source "$(dirname "${BASH_SOURCE[0]}")/lib/server.sh"
server_main "$@"
