# The start/stop/watchdog logic of the throwaway servers in hack/
# (postgres.sh, redis.sh, rabbitmq.sh, registry.sh), sourced by each. A
# server script sets NAME, DEFAULT_PORT and READY_TIMEOUT (seconds), defines
# the hooks below, sources this file and calls server_main "$@":
#
#   server_prepare        optional: install the server if missing, make DIR
#                         ready for it (runs before each start, DIR absolute)
#   server_running        succeeds when the server of DIR is alive
#   server_port           prints the port the running server of DIR listens on
#   server_start PORT     starts the server in DIR on 127.0.0.1:PORT and waits
#                         until it is ready (at most READY_TIMEOUT), or dies
#   server_addr PORT      prints its address or URL, what start prints
#   server_stop           stops the running server of DIR and waits for it
#   server_after_stop     optional: runs after every stop
#
# What each script then does:
#
#   SCRIPT start DIR [PORT]   PORT defaults to DEFAULT_PORT
#   SCRIPT stop DIR
#
# start makes DIR, starts the server in it and prints its address on stdout;
# it is idempotent: if the server of DIR already runs it prints its address.
# stop stops it; stopping a stopped server is not an error. Everything but
# the address goes to stderr.
#
# Environment:
#   HANDOFF_WATCH_PID  if set, start also leaves a watchdog that stops the
#                      server once that process exits (internal/servertest
#                      sets it to the test binary's PID, so an interrupted
#                      test does not leak a server). The watchdog runs in a
#                      session of its own, so the signal that kills a
#                      process group (^C, a timeout) does not kill it too,
#                      and writes to DIR/watchdog.log.

log() { echo "$NAME: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}
usage() { die "usage: $SELF start DIR [PORT] | stop DIR"; }

# MAX_PORT is the highest PORT start takes (RabbitMQ uses PORT+1 too).
MAX_PORT=${MAX_PORT:-65535}

server_main() {
  SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
  local cmd=${1:-}
  DIR=${2:-}
  [ -n "$DIR" ] || usage
  case "$cmd" in
    start) _server_start "${3:-$DEFAULT_PORT}" ;;
    stop) _server_stop ;;
    _watchdog) _server_watchdog "${3:?}" ;;
    *) usage ;;
  esac
}

_server_start() {
  local port=$1
  if ! [[ "$port" =~ ^[0-9]+$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt "$MAX_PORT" ]; then
    die "PORT $port: want a number from 1 to $MAX_PORT"
  fi
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd)
  if declare -F server_prepare >/dev/null; then server_prepare; fi

  if server_running; then
    local have
    have=$(server_port)
    [ "$have" = "$port" ] || log "already running on port $have (not $port)"
    log "already running in $DIR"
    server_addr "$have"
    return
  fi

  server_start "$port"
  if [ -n "${HANDOFF_WATCH_PID:-}" ]; then
    _server_watch "$HANDOFF_WATCH_PID"
  fi
  server_addr "$port"
}

# _server_watch leaves the watchdog that stops the server once process $1
# is gone.
_server_watch() {
  local pid=$1
  [[ "$pid" =~ ^[0-9]+$ ]] || die "HANDOFF_WATCH_PID $pid: want a process id"
  log "will stop the server when process $pid exits"
  setsid -f bash "$SELF" _watchdog "$DIR" "$pid" </dev/null >>"$DIR/watchdog.log" 2>&1
}

# _server_watchdog is the process _server_watch leaves behind.
_server_watchdog() {
  local pid=$1
  while kill -0 "$pid" 2>/dev/null; do sleep 1; done
  log "process $pid is gone; stopping the server"
  _server_stop
}

_server_stop() {
  if [ -d "$DIR" ]; then
    DIR=$(cd "$DIR" && pwd)
  fi
  if [ -d "$DIR" ] && server_running; then
    server_stop
  else
    log "not running in $DIR"
  fi
  if declare -F server_after_stop >/dev/null; then server_after_stop; fi
}
