#!/usr/bin/env bash
# Builds and tests the Node SDK (@handoff-dev/worker, and its BullMQ
# integration @handoff-dev/bullmq in bullmq/, a workspace), as the repository's
# CI runs it: bash sdk/node/test.sh
#
#  1. npm ci (the dev dependencies: typescript, @types/node, yaml, and for
#     bullmq/ bullmq and ioredis; @handoff-dev/worker has no runtime ones)
#  2. the handoff binary, for the conformance run and the BullMQ handover:
#     $HANDOFF_BIN, or built here from ./cmd/handoff into a temporary
#     directory with the Go of the environment (GOTOOLCHAIN, GOMODCACHE,
#     GOCACHE as set)
#  3. a Redis for the BullMQ tests: Debian's redis-server (installed with
#     apt-get if missing) started by hack/redis.sh on a free port, stopped
#     at the end ($HANDOFF_TEST_REDIS)
#  4. tsc: src/ and bullmq/src/ to dist/ (ESM and .d.ts), and a type check
#     of examples/*.ts and examples/bullmq-worker.mjs
#  5. npm pack of @handoff-dev/worker, installed (npm install --offline of
#     the tarball) into a scratch npm project in a temporary directory with
#     copies of examples/worker.mjs, memory-queue.mjs and fixture.mjs
#  6. node --test: unit and HTTP tests, the generated types checked against
#     docs/protocol.yaml, no import circle in src/ and bullmq/src/ and no
#     Agent internals in dist/*.d.ts (test/structure.test.mjs), `handoff
#     conformance` on the installed copy (the scratch project's worker and
#     fixture, $HANDOFF_SDK_NODE_APP) over a socket and over TCP, the
#     BullMQ adapter on the real Redis, and a handover between two pods of
#     examples/bullmq-worker.mjs, each beside the real sidecar; no test may
#     be skipped
#  7. npm pack --dry-run: the packages' contents
#
# Exits non-zero on any failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$here"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/handoff-sdk-node.XXXXXX")"
cleanup() {
  bash "$repo/hack/redis.sh" stop "$tmp/redis" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

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

step "a Redis for the BullMQ tests (hack/redis.sh)"
port="$(node -e "const s = require('net').createServer().listen(0, '127.0.0.1', () => { console.log(s.address().port); s.close(); })")"
HANDOFF_TEST_REDIS="$(HANDOFF_WATCH_PID=$$ bash "$repo/hack/redis.sh" start "$tmp/redis" "$port")"
export HANDOFF_TEST_REDIS
echo "HANDOFF_TEST_REDIS=$HANDOFF_TEST_REDIS"

step "tsc: src -> dist, bullmq/src -> bullmq/dist, and a type check of the examples"
npm run --silent build
npm run --silent build -w bullmq
npm run --silent typecheck:examples

step "npm pack @handoff-dev/worker, installed into a scratch npm project"
mkdir -p "$tmp/pack" "$tmp/app"
# Built above: no prepack rebuild.
tgz="$tmp/pack/$(npm pack --ignore-scripts --silent --pack-destination "$tmp/pack" | tail -1)"
echo "packed $tgz"
echo '{ "name": "handoff-installed-check", "version": "0.0.0", "private": true, "type": "module" }' >"$tmp/app/package.json"
(cd "$tmp/app" && npm install --offline --no-audit --no-fund --no-package-lock --loglevel=error "$tgz")
if [[ -L "$tmp/app/node_modules/@handoff-dev/worker" || ! -f "$tmp/app/node_modules/@handoff-dev/worker/dist/testing.js" ]]; then
  echo "test.sh: @handoff-dev/worker is not installed from $tgz in $tmp/app" >&2
  exit 1
fi
cp examples/worker.mjs examples/memory-queue.mjs examples/fixture.mjs "$tmp/app/"
export HANDOFF_SDK_NODE_APP="$tmp/app"

step "node --test (conformance on the installed copy in $HANDOFF_SDK_NODE_APP)"
node --test --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=tap --test-reporter-destination="$tmp/tests.tap" test/ bullmq/test/
skipped="$(sed -n 's/^# skipped \([0-9]*\)$/\1/p' "$tmp/tests.tap")"
if [[ "$skipped" != "0" ]]; then
  echo "test.sh: ${skipped:-?} tests skipped; want none (the conformance run and the BullMQ handover need HANDOFF_BIN)" >&2
  exit 1
fi
# Both conformance runs (socket and TCP) on the installed package.
if [[ "$(grep -cE "^ *# installed @handoff-dev/worker: $(cd "$tmp" && pwd -P)/app/node_modules/@handoff-dev/worker/dist/index.js " "$tmp/tests.tap")" != 2 ]]; then
  echo "test.sh: the conformance runs did not use the @handoff-dev/worker installed in $tmp/app" >&2
  exit 1
fi

step "npm pack --dry-run"
# Each package ships the Apache-2.0 LICENSE (a copy of the repository's).
for dir in . bullmq; do
  contents=$(cd "$dir" && npm pack --dry-run 2>&1 | sed -n '/Tarball Contents/,/Tarball Details/p')
  echo "$contents"
  grep -q ' LICENSE$' <<<"$contents" || { echo "test.sh: the package in sdk/node/$dir packs no LICENSE" >&2; exit 1; }
done

step "sdk/node: ok"
