#!/usr/bin/env bash
# Prints the rollout figures of one run: a kubectl rollout restart of the
# example worker under load, with handoff and, as the baseline, without it,
# on a cluster booted for the run (as root; or the cluster named by
# HANDOFF_E2E_KUBECONFIG, see e2e/e2e_test.go). Per replaced pod: time from
# termination start to the Lease held by a successor, how long its
# unfinished claims stayed out of circulation, messages lost or applied
# twice; then both rollouts side by side, and their ratio. It also draws
# the first two, the worst replaced pod's of each rollout, handoff beside
# the baseline, as a picture in bin/rollout-figures.svg, and prints its
# path last.
#
# Usage: make rollout-figures, which builds what the test runs first
# (e2e/rollout-figures.sh alone builds it within the test's timeout).
# The test's log goes to $TMPDIR/handoff-rollout-figures.log.
set -euo pipefail
cd "$(dirname "$0")/.."
log=${TMPDIR:-/tmp}/handoff-rollout-figures.log
figures=$(mktemp)
trap 'rm -f "$figures"' EXIT
# The picture, given to the test as an absolute path (go test runs it in
# e2e/); one of an earlier run is removed first.
svg=bin/rollout-figures.svg
mkdir -p bin
rm -f "$svg"
echo "running TestRolloutRestart (about 6 minutes; log: $log)" >&2
if ! HANDOFF_E2E_FIGURES=$figures HANDOFF_E2E_FIGURES_SVG=$PWD/$svg go test -tags e2e -count=1 -v -timeout 30m -run '^TestRolloutRestart$' ./e2e/ >"$log" 2>&1; then
  echo "TestRolloutRestart failed; the end of its log:" >&2
  tail -40 "$log" >&2
  [ -s "$figures" ] && cat "$figures"
  [ -s "$svg" ] && echo "rollout picture (of the failed run): $svg"
  exit 1
fi
cat "$figures"
echo "rollout picture: $svg"
