#!/usr/bin/env bash
# Prints the rollout figures of one run: a kubectl rollout restart of the
# example worker under load, with handoff and, as the baseline, without it,
# on a cluster booted for the run (as root; or the cluster named by
# HANDOFF_E2E_KUBECONFIG, see e2e/e2e_test.go). Per replaced pod: time from
# termination start to the Lease held by a successor, how long its
# unfinished claims stayed out of circulation, messages lost or applied
# twice; then both rollouts side by side, and their ratio.
#
# Usage: make rollout-figures, which builds what the test runs first
# (e2e/rollout-figures.sh alone builds it within the test's timeout).
# The test's log goes to $TMPDIR/handoff-rollout-figures.log.
set -euo pipefail
cd "$(dirname "$0")/.."
log=${TMPDIR:-/tmp}/handoff-rollout-figures.log
figures=$(mktemp)
trap 'rm -f "$figures"' EXIT
echo "running TestRolloutRestart (about 6 minutes; log: $log)" >&2
if ! HANDOFF_E2E_FIGURES=$figures go test -tags e2e -count=1 -v -timeout 30m -run '^TestRolloutRestart$' ./e2e/ >"$log" 2>&1; then
  echo "TestRolloutRestart failed; the end of its log:" >&2
  tail -40 "$log" >&2
  [ -s "$figures" ] && cat "$figures"
  exit 1
fi
cat "$figures"
