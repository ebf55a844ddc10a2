#!/usr/bin/env bash
# Checks the repository's Go modules (go.work): that they require each other
# at one version with no replace directive in any go.mod, go.work replacing
# that version of each with its directory (go run ./hack/modrelease check),
# and that each is as `go mod tidy` leaves it (a require or a go.sum line
# missing or left over fails, naming the module and the diff).
#
#   hack/modules.sh        check (make lint)
#   hack/modules.sh tidy   tidy every module in place
#
# go mod tidy runs outside the workspace (GOWORK=off), as each module is
# built on its own, on a copy of the module's go.mod that replaces the
# repository's other modules with their directories (the versions they
# require each other at are the last release's, which the tree has moved
# on from, or before the first release none that a proxy serves). Their
# go.sum lines (the release's hashes, written by hack/release-modules.sh)
# are left out of the comparison and kept by tidy.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-check}
[[ "$mode" == check || "$mode" == tidy ]] || { echo "usage: hack/modules.sh [check|tidy]" >&2; exit 2; }

root=$PWD
dirs=$(go work edit -json | sed -n 's/.*"DiskPath": "\(.*\)".*/\1/p')
paths=()
for dir in $dirs; do
  paths+=("$(sed -n "s/^module //p" "$dir/go.mod")")
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail=0
if [ "$mode" = check ] && ! go run ./hack/modrelease check; then
  fail=1
fi
for dir in $dirs; do
  own="^($(IFS='|'; echo "${paths[*]}")) "
  copy="$tmp/${dir//\//_}"
  mkdir -p "$copy"
  cp "$dir/go.mod" "$copy/go.mod"
  # The go.sum lines of the repository's modules: kept aside.
  grep -Ev "$own" "$dir/go.sum" >"$copy/go.sum" 2>/dev/null || true
  grep -E "$own" "$dir/go.sum" >"$copy/own.sum" 2>/dev/null || true
  reps=()
  for i in "${!paths[@]}"; do
    d=$(echo $dirs | cut -d' ' -f$((i + 1)))
    [ "$d" = "$dir" ] || reps+=("-replace=${paths[i]}=$root/$d")
  done
  go mod edit "${reps[@]}" "$copy/go.mod"
  if [ "$mode" = check ]; then
    if ! out=$(cd "$dir" && GOWORK=off GOFLAGS=-mod=mod go mod tidy -diff -modfile="$copy/go.mod" 2>&1); then
      echo "modules: $dir is not as go mod tidy leaves it (run: hack/modules.sh tidy):" >&2
      echo "$out" >&2
      fail=1
    fi
    continue
  fi
  (cd "$dir" && GOWORK=off GOFLAGS=-mod=mod go mod tidy -modfile="$copy/go.mod")
  drops=()
  for p in "${paths[@]}"; do drops+=("-dropreplace=$p"); done
  go mod edit "${drops[@]}" "$copy/go.mod"
  cp "$copy/go.mod" "$dir/go.mod"
  # go.sum: tidy's lines with the repository's modules' put back in place
  # (go sorts by module path; theirs share one prefix).
  if [ -s "$copy/own.sum" ]; then
    LC_ALL=C awk -v own="$copy/own.sum" '
      BEGIN { while ((getline l < own) > 0) o = o l "\n" }
      !done && $1 > "github.com/handoff-dev/handoff" { printf "%s", o; done = 1 }
      { print }
      END { if (!done) printf "%s", o }' "$copy/go.sum" >"$dir/go.sum"
  elif [ -s "$copy/go.sum" ]; then
    cp "$copy/go.sum" "$dir/go.sum"
  else
    rm -f "$dir/go.sum"
  fi
done
exit $fail
