#!/usr/bin/env bash
# Prints the successor figures of one run (docs/performance.md, "One move
# per rollout"): rolling updates of 3 and 5 replicas under load, each with
# the leaving leader's release naming its successor (as handoff ships) and,
# as the baseline in the same run, with handoff.dev/prefer-successor
# "false" (every standby races); the role Lease's moves, its free time per
# move, each leader's handover hop by hop, and an empty Lease write's round
# trip measured in the same run. On a cluster booted for the run (as root;
# or the one HANDOFF_E2E_KUBECONFIG names, see e2e/e2e_test.go).
#
# Usage: make successor-figures (about 8 minutes); HANDOFF_E2E_SIDECAR_CPU_REQUEST=100m
# gives every rolled-out sidecar that CPU request (default the chart's 10m). The test's log goes to
# $TMPDIR/handoff-successor-figures.log.
set -euo pipefail
cd "$(dirname "$0")/.."
log=${TMPDIR:-/tmp}/handoff-successor-figures.log
figures=$(mktemp)
trap 'rm -f "$figures"' EXIT
echo "running TestRolloutMovesTheRoleOnce (about 8 minutes; log: $log)" >&2
if ! HANDOFF_E2E_SUCCESSOR_FIGURES=$figures go test -tags e2e -count=1 -v -timeout 30m -run '^TestRolloutMovesTheRoleOnce$' ./e2e/ >"$log" 2>&1; then
  echo "TestRolloutMovesTheRoleOnce failed; the end of its log:" >&2
  tail -40 "$log" >&2
  [ -s "$figures" ] && cat "$figures"
  exit 1
fi
cat "$figures"
