#!/usr/bin/env bash
# The soak: N rollout restarts in a row (default 20) of one Deployment of 3
# injected workers under load, on a cluster booted for the run (as root; or
# the cluster named by HANDOFF_E2E_KUBECONFIG, see e2e/e2e_test.go). Prints,
# per run and in sum: messages lost, applied twice, overlapping leader runs
# (the pods' own view of who led), and the leaving leader's handover time.
# Exits non-zero if anything was lost, applied twice or overlapped.
#
# Usage: make soak [SOAK_RUNS=N], which builds what the test runs first, or
#        e2e/soak.sh [N]                 (about 1 minute a run, plus set-up)
# The test's log goes to $TMPDIR/handoff-soak.log.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-${SOAK_RUNS:-20}}
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "soak: N=$runs: want a number of rollout restarts, 1 or more" >&2; exit 2; }
log=${TMPDIR:-/tmp}/handoff-soak.log
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "running $runs rollout restarts (TestSoak, about $((runs + 2)) minutes; log: $log)" >&2
status=0
HANDOFF_E2E_SOAK=$runs HANDOFF_E2E_SOAK_OUT=$out go test -tags e2e -count=1 -v -timeout "$((runs * 3 + 15))m" \
  -run '^TestSoak$' ./e2e/ >"$log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  echo "TestSoak failed; the end of its log:" >&2
  tail -40 "$log" >&2
fi
[ -s "$out" ] && cat "$out"
exit "$status"
