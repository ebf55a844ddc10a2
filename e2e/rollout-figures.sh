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
# Usage: make rollout-figures [SCRAPE_INTERVAL=30s], which builds what the
# test runs first (e2e/rollout-figures.sh [SCRAPE_INTERVAL] alone builds it
# within the test's timeout). SCRAPE_INTERVAL is the e2e Prometheus's
# (default 1s): a pod with nothing to drain must go as fast at 30s.
# The test's log goes to $TMPDIR/handoff-rollout-figures.log.
set -euo pipefail
cd "$(dirname "$0")/.."
log=${TMPDIR:-/tmp}/handoff-rollout-figures.log
figures=$(mktemp)
trap 'rm -f "$figures"' EXIT
# The picture, given to the test as an absolute path (go test runs it in
# e2e/); one of an earlier run is removed first.
scrape=${1:-${SCRAPE_INTERVAL:-1s}}
[[ "$scrape" =~ ^[0-9]+s$ ]] || { echo "rollout-figures: SCRAPE_INTERVAL=$scrape: want seconds, like 30s" >&2; exit 2; }
svg=bin/rollout-figures.svg
mkdir -p bin
rm -f "$svg"
echo "running TestRolloutRestart (about 6 minutes; log: $log)" >&2
if ! HANDOFF_E2E_SCRAPE_INTERVAL=$scrape HANDOFF_E2E_FIGURES=$figures HANDOFF_E2E_FIGURES_SVG=$PWD/$svg go test -tags e2e -count=1 -v -timeout 30m -run '^TestRolloutRestart$' ./e2e/ >"$log" 2>&1; then
  echo "TestRolloutRestart failed; the end of its log:" >&2
  tail -40 "$log" >&2
  [ -s "$figures" ] && cat "$figures"
  [ -s "$svg" ] && echo "rollout picture (of the failed run): $svg"
  exit 1
fi
cat "$figures"
echo "rollout picture: $svg"
