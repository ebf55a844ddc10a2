#!/usr/bin/env bash
# Installs the pinned nats-server (with JetStream) into $HANDOFF_CACHE/bin
# (default ~/.cache/handoff/bin) if that version is missing, and prints the
# binary's path on stdout. Everything else goes to stderr.
#
# Usage: nats=$(bash hack/nats-server.sh) && "$nats" --version
#
# It is built from the Go module proxy with `go install`, as hack/tools.sh
# builds its tools, and stamped the same way (version and the Go that built
# it), so an unchanged pin costs nothing. internal/natstest runs it on first
# use; the Makefile runs it before the tests so the build (1-3 min on 2
# cores) is not inside a test's timeout.
set -euo pipefail

VERSION=v2.15.2 # github.com/nats-io/nats-server/v2

CACHE=${HANDOFF_CACHE:-$HOME/.cache/handoff}
BIN="$CACHE/bin"
mkdir -p "$BIN"
stamp="$BIN/.nats-server.version"
want="$VERSION $(go env GOVERSION)"
if [[ -x "$BIN/nats-server" && -f "$stamp" && "$(<"$stamp")" == "$want" ]]; then
  echo "$BIN/nats-server"
  exit 0
fi
echo "nats-server.sh: installing nats-server $VERSION" >&2
# GOFLAGS is reset: a caller's -mod=vendor would make `go install m@v` fail.
GOBIN="$BIN" GOFLAGS=-mod=mod CGO_ENABLED=0 go install -trimpath "github.com/nats-io/nats-server/v2@$VERSION" >&2
echo "$want" >"$stamp"
echo "$BIN/nats-server"
