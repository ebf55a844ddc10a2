#!/usr/bin/env bash
# Checks the shipped binaries (./cmd/handoff, ./cmd/handoff-sidecar, and the example worker) for known
# vulnerabilities reachable from its code: govulncheck, offline, against the
# Go vulnerability database as the module golang.org/x/vulndb serves it from
# the Go module proxy (its data/osv folder). Exits non-zero on any finding
# that the code calls; one only in an imported module's unused code is listed
# by -show verbose and does not fail.
#
# The toolchain matters: govulncheck reports the standard library of the Go
# that runs it, so run it (as `make vuln` does) with GOTOOLCHAIN=go1.27.3.
set -euo pipefail
cd "$(dirname "$0")/.."

VULNDB_VERSION=${VULNDB_VERSION:-v0.0.0-20261105234957-e22db6528018}
CACHE=${HANDOFF_CACHE:-$HOME/.cache/handoff}
work="$CACHE/build/vulndb"
mkdir -p "$work"
[ -f "$work/go.mod" ] || (cd "$work" && go mod init handoff.local/vulndb >/dev/null 2>&1)
dir=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "golang.org/x/vulndb@$VULNDB_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
[ -d "$dir/data/osv" ] || { echo "vuln: no data/osv in $dir" >&2; exit 1; }

bin=$(bash hack/tools.sh)
echo "vuln: $(go version), database golang.org/x/vulndb@$VULNDB_VERSION" >&2
"$bin/govulncheck" -db "file://$dir/data/osv" ./cmd/handoff ./cmd/handoff-sidecar ./examples/pgworker
