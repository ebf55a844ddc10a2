#!/usr/bin/env bash
# The nemesis: fault schedules drawn from seeds, each run on a cluster booted
# for the run (as root; the cluster's own processes are paused and
# restarted, so not on a cluster named by HANDOFF_E2E_KUBECONFIG) under the
# example worker's load in two Deployments with rollouts and scale changes
# going on, and the recorded history checked (internal/nemesis: exactly
# once, fencing tokens, leader overlap, a live holder after each heal, pods
# gone within their grace period). Prints each schedule, every violation
# with its seed, schedule and slice of history, and the figures in sum:
# faults of each kind, messages, Lease moves, violations, the worst time to
# a live holder after a heal. Exits non-zero on any violation.
#
# Usage: make nemesis [NEMESIS_SEEDS=1-30] [NEMESIS_FAULTS=10] [NEMESIS_WINDOW=2m] [NEMESIS_KINDS=all]
#        e2e/nemesis.sh [SEEDS [FAULTS [WINDOW [KINDS]]]]
#   SEEDS   FIRST-LAST or a comma-separated list (default 1-30); one seed
#           replays its schedule: e2e/nemesis.sh 17
#   FAULTS  faults a schedule (default 10); WINDOW the time they start in
#   KINDS   a comma-separated list of fault kinds (internal/nemesis.Kinds), or all
# About 3 to 4 minutes a schedule of 10 faults in 2m, plus set-up. The test's
# log goes to $TMPDIR/handoff-nemesis.log.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-${NEMESIS_SEEDS:-1-30}}
faults=${2:-${NEMESIS_FAULTS:-10}}
window=${3:-${NEMESIS_WINDOW:-2m}}
kinds=${4:-${NEMESIS_KINDS:-all}}
[[ "$seeds" =~ ^[0-9]+(-[0-9]+|(,[0-9]+)*)$ ]] || { echo "nemesis: SEEDS=$seeds: want FIRST-LAST or a comma-separated list of numbers" >&2; exit 2; }
[[ "$faults" =~ ^[1-9][0-9]*$ ]] || { echo "nemesis: FAULTS=$faults: want a number of faults per schedule, 1 or more" >&2; exit 2; }
if [[ "$seeds" == *-* ]]; then n=$(( ${seeds#*-} - ${seeds%-*} + 1 )); else n=$(tr -cd , <<<"$seeds" | wc -c); n=$((n + 1)); fi
log=${TMPDIR:-/tmp}/handoff-nemesis.log
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "running $n schedules of $faults faults in $window (seeds $seeds, kinds $kinds; about $((n * 4 + 5)) minutes; log: $log)" >&2
status=0
HANDOFF_E2E_NEMESIS_SEEDS=$seeds HANDOFF_E2E_NEMESIS_FAULTS=$faults HANDOFF_E2E_NEMESIS_WINDOW=$window \
  HANDOFF_E2E_NEMESIS_KINDS=$kinds HANDOFF_E2E_NEMESIS_OUT=$out \
  go test -tags e2e -count=1 -v -timeout "$((n * 8 + 20))m" -run '^TestNemesis$' ./e2e/ >"$log" 2>&1 || status=$?
grep -E '^\s+nemesis_test.go:[0-9]+: (nemesis seed|seed [0-9]+:)|VIOLATION' "$log" >&2 || true
if [ "$status" -ne 0 ]; then
  echo "TestNemesis failed; the end of its log:" >&2
  tail -60 "$log" >&2
fi
[ -s "$out" ] && cat "$out"
exit "$status"
