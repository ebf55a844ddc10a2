#!/usr/bin/env bash
# Prints the shard figures of one run: a kubectl rollout restart of 3
# replicas of the example worker over a shard set of 12 Leases, under a
# load whose messages carry a shard key, on a cluster booted for the run
# (as root; or the cluster named by HANDOFF_E2E_KUBECONFIG, see
# e2e/e2e_test.go). Shards moved per replaced pod beside the least
# possible (each shard once, to a pod of the new revision), the moves to a
# pod the rollout replaced and the shards moved more than once, the longest
# time any shard had no holder, the largest share a pod held against ceil(N/M), the
# Lease requests per pod per minute, messages lost or applied twice, and
# claims of one shard worked by two pods at once.
#
# Usage: make shard-figures, which builds what the test runs first
# (e2e/shard-figures.sh alone builds it within the test's timeout).
# The test's log goes to $TMPDIR/handoff-shard-figures.log.
set -euo pipefail
cd "$(dirname "$0")/.."
log=${TMPDIR:-/tmp}/handoff-shard-figures.log
figures=$(mktemp)
trap 'rm -f "$figures"' EXIT
echo "running TestShardRollout (about 2 minutes; log: $log)" >&2
if ! HANDOFF_E2E_SHARD_FIGURES=$figures go test -tags e2e -count=1 -v -timeout 30m -run '^TestShardRollout$' ./e2e/ >"$log" 2>&1; then
  echo "TestShardRollout failed; the end of its log:" >&2
  tail -40 "$log" >&2
  [ -s "$figures" ] && cat "$figures"
  exit 1
fi
cat "$figures"
