#!/usr/bin/env bash
# Installs the pinned nats-server (with JetStream) into $HANDOFF_CACHE/bin
# (default ~/.cache/handoff/bin) if that version is missing, and prints the
# binary's path on stdout. Everything else goes to stderr.
#
# Usage: nats=$(bash hack/nats-server.sh) && "$nats" --version
#
# It is built from the Go module proxy with `go install`, as hack/tools.sh
# builds its tools, with a stamp of the version beside the binary, so an
# unchanged pin costs nothing. Unlike an analyser, a server does not depend
# on the caller's Go, so the stamp does not name the Go that built it.
#
# internal/natstest runs it on first use. Run it before `go test` (the
# Makefile's integration target) so that a cold build, 1-3 minutes on 2
# cores, is not inside a test binary's timeout.
set -euo pipefail

VERSION=v2.15.2 # github.com/nats-io/nats-server/v2

CACHE=${HANDOFF_CACHE:-$HOME/.cache/handoff}
BIN="$CACHE/bin"
mkdir -p "$BIN"
stamp="$BIN/.nats-server.version"
want="$VERSION"
# Test binaries run in parallel may all call this at once: one builds, the
# others wait for it and find the binary.
exec 9>"$BIN/.nats-server.lock"
flock 9
if [[ -x "$BIN/nats-server" && -f "$stamp" && "$(<"$stamp")" == "$want" ]]; then
  echo "$BIN/nats-server"
  exit 0
fi
echo "nats-server.sh: installing nats-server $VERSION" >&2
# GOFLAGS is reset: a caller's -mod=vendor would make `go install m@v` fail.
GOBIN="$BIN" GOFLAGS=-mod=mod CGO_ENABLED=0 go install -trimpath "github.com/nats-io/nats-server/v2@$VERSION" >&2
echo "$want" >"$stamp"
echo "$BIN/nats-server"
