#!/usr/bin/env bash
# Builds and tests the Node SDK (@handoff/worker), as the repository's CI
# runs it: bash sdk/node/test.sh
#
#  1. npm ci (the dev dependencies: typescript, @types/node, yaml; no runtime ones)
#  2. the handoff binary, for the conformance run: $HANDOFF_BIN, or built
#     here from ./cmd/handoff into a temporary directory with the Go of the
#     environment (GOTOOLCHAIN, GOMODCACHE, GOCACHE as set)
#  3. tsc: src/ to dist/ (ESM and .d.ts), and a type check of examples/*.ts
#  4. node --test: unit and HTTP tests, the generated types checked against
#     docs/protocol.yaml, and `handoff conformance` on examples/worker.mjs
#     over a socket and over TCP; no test may be skipped
#  5. npm pack --dry-run: the package's contents
#
# Exits non-zero on any failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$here"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/handoff-sdk-node.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

step() { printf '\n== %s\n' "$*"; }

step "node $(node --version), npm $(npm --version): npm ci"
npm ci --no-audit --no-fund --loglevel=error

if [[ -z "${HANDOFF_BIN:-}" ]]; then
  step "building the handoff binary for the conformance run"
  if ! command -v go >/dev/null; then
    echo "test.sh: go is not installed and HANDOFF_BIN is not set: the conformance run needs the handoff binary" >&2
    exit 1
  fi
  (cd "$repo" && go build -o "$tmp/handoff" ./cmd/handoff)
  export HANDOFF_BIN="$tmp/handoff"
fi
echo "HANDOFF_BIN=$HANDOFF_BIN"

step "tsc: src -> dist, and a type check of the examples"
npm run --silent build
npm run --silent typecheck:examples

step "node --test"
node --test --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=tap --test-reporter-destination="$tmp/tests.tap" test/
skipped="$(sed -n 's/^# skipped \([0-9]*\)$/\1/p' "$tmp/tests.tap")"
if [[ "$skipped" != "0" ]]; then
  echo "test.sh: ${skipped:-?} tests skipped; want none (the conformance run needs HANDOFF_BIN)" >&2
  exit 1
fi

step "npm pack --dry-run"
npm pack --dry-run 2>&1 | sed -n '/Tarball Contents/,/Tarball Details/p'

step "sdk/node: ok"
