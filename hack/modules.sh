#!/usr/bin/env bash
# Checks each of the repository's Go modules (go.work) as `go mod tidy`
# leaves it: a require or a go.sum line missing or left over fails, naming
# the module and the diff. Run outside the workspace (GOWORK=off), as each
# module is built on its own.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
for dir in $(go work edit -json | sed -n 's/.*"DiskPath": "\(.*\)".*/\1/p'); do
  if ! out=$(cd "$dir" && GOWORK=off GOFLAGS=-mod=mod go mod tidy -diff 2>&1); then
    echo "modules: $dir is not as go mod tidy leaves it (run: cd $dir && GOWORK=off go mod tidy):" >&2
    echo "$out" >&2
    fail=1
  fi
done
exit $fail
