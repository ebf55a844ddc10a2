#!/usr/bin/env bash
# The sidecar's calls to the app, per SDK (bench/roundtrip): package
# worker's Agent (Go), the Python SDK's threaded and asyncio example
# workers, and the Node SDK's example worker, each a process of its own on
# its own Unix socket, called as the sidecar calls them (signed); prints
# p50 and p99 of a grant, a drain status and stop-claiming beside Go's from
# the same run, and the target (each SDK within 2 ms of Go's p99).
#
# Usage: bash hack/roundtrip.sh [-n 2000]   (make roundtrip)
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=${GOTOOLCHAIN:-go1.27.3}
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3)
(cd sdk/node && { [ -d node_modules ] || npm ci --silent --no-audit --no-fund >/dev/null; } && npm run --silent build >/dev/null)
q=$(mktemp -d)
trap 'rm -rf "$q"' EXIT
export PYTHONPATH=$PWD/sdk/python/src
go run ./bench/roundtrip "$@" \
  -app "python=$python sdk/python/examples/worker.py --queue $q/py" \
  -app "python-asyncio=$python sdk/python/examples/aio_worker.py --queue $q/aio" \
  -app "node=node sdk/node/examples/worker.mjs"
