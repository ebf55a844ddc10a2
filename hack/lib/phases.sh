# shellcheck shell=bash
# Phases of a long run (sourced by .ci/run and hack/test.sh): each phase is
# announced with the clock time, timed, and run to its end whatever the
# phases before it did; phases_end prints one line per phase (its time and
# result), then the failed tests named in the failed phases' output, and
# returns non-zero if any phase failed.
#
#   source hack/lib/phases.sh
#   phase "lint" make lint
#   phase "tests" make test
#   phases_end

_phases_dir=$(mktemp -d "${TMPDIR:-/tmp}/handoff-phases.XXXXXX")
_phases=()

# phase NAME CMD...: runs CMD, its output shown as it comes and kept for
# phases_end; records NAME's time and exit code.
phase() {
  local name=$1
  shift
  local i=${#_phases[@]}
  local start=$SECONDS rc
  echo "--- $(date +%H:%M:%S) $name"
  # The exit code is the command's, whatever the caller's set -e and
  # pipefail.
  { "$@" && echo 0 >"$_phases_dir/$i.exit" || echo $? >"$_phases_dir/$i.exit"; } 2>&1 | tee "$_phases_dir/$i.log"
  rc=$(cat "$_phases_dir/$i.exit")
  local took=$((SECONDS - start))
  _phases+=("$name")
  echo "$rc $took" >"$_phases_dir/$i.rc"
  if [ "$rc" -eq 0 ]; then
    echo "--- $(date +%H:%M:%S) $name: ok in $(_phases_dur "$took")"
  else
    echo "--- $(date +%H:%M:%S) $name: FAILED (exit $rc) in $(_phases_dur "$took")"
  fi
}

_phases_dur() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# phases_end: the summary; returns 1 if a phase failed.
phases_end() {
  local i rc took failed=0 nfailed=0 total=0
  echo
  echo "=== phases"
  for i in "${!_phases[@]}"; do
    read -r rc took <"$_phases_dir/$i.rc"
    total=$((total + took))
    if [ "$rc" -eq 0 ]; then
      printf '  %-9s %-8s %s\n' ok "$(_phases_dur "$took")" "${_phases[$i]}"
    else
      printf '  %-9s %-8s %s\n' "FAIL($rc)" "$(_phases_dur "$took")" "${_phases[$i]}"
      failed=1
      nfailed=$((nfailed + 1))
    fi
  done
  printf '  %-9s %-8s %s\n' "" "$(_phases_dur "$total")" total
  if [ "$failed" -eq 1 ]; then
    echo
    echo "=== failures"
    for i in "${!_phases[@]}"; do
      read -r rc took <"$_phases_dir/$i.rc"
      [ "$rc" -eq 0 ] && continue
      echo "  ${_phases[$i]}:"
      # go test's failed tests and packages, golangci-lint's and vet's
      # findings; otherwise the phase's last lines.
      if grep -qE -- '^\s*--- FAIL: |^FAIL\s|^[^ ]+\.go:[0-9]+:[0-9]+: ' "$_phases_dir/$i.log"; then
        grep -E -- '^\s*--- FAIL: |^FAIL\s|^[^ ]+\.go:[0-9]+:[0-9]+: ' "$_phases_dir/$i.log" | sed 's/^ */    /' | awk '!seen[$0]++' | head -60
      else
        tail -n 5 "$_phases_dir/$i.log" | sed 's/^/    /'
      fi
    done
  fi
  rm -rf "$_phases_dir"
  echo
  echo "phases: $((${#_phases[@]} - nfailed)) passed, $nfailed failed"
  return "$failed"
}
