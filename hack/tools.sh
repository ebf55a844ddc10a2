#!/usr/bin/env bash
# Installs the project's pinned Go tools into $HANDOFF_CACHE/bin
# (default ~/.cache/handoff/bin), each only if that version is missing, and
# prints the bin directory on stdout. Everything else goes to stderr.
#
# Usage: bin=$(hack/tools.sh) && "$bin/golangci-lint" run ./...
#
# Tools are built from the Go module proxy with `go install`, so this works
# wherever `go` can reach the proxy (or has the modules cached).
set -euo pipefail

# One tool a line: name=module/path/to/cmd@version. name is the binary that
# `go install` produces (the last element of the package path).
TOOLS='
golangci-lint=github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0
helm=helm.sh/helm/v3/cmd/helm@v3.22.0
helm-unittest=github.com/helm-unittest/helm-unittest@v1.1.2
'

CACHE=${HANDOFF_CACHE:-$HOME/.cache/handoff}
BIN="$CACHE/bin"
mkdir -p "$BIN"

log() { echo "tools: $*" >&2; }

while IFS= read -r line; do
  [[ -z "$line" || "$line" == \#* ]] && continue
  name=${line%%=*}
  pkg=${line#*=}
  version=${pkg##*@}
  # A stamp beside the binary records the version installed, so a bumped pin
  # reinstalls and an unchanged one costs nothing.
  stamp="$BIN/.$name.version"
  if [[ -x "$BIN/$name" && -f "$stamp" && "$(<"$stamp")" == "$version" ]]; then
    continue
  fi
  log "installing $name $version"
  # GOFLAGS is reset: a caller's -mod=vendor would make `go install m@v` fail.
  GOBIN="$BIN" GOFLAGS=-mod=mod go install "$pkg" >&2
  echo "$version" >"$stamp"
done <<<"$TOOLS"

# helm-unittest runs as a helm plugin: HELM_PLUGINS=$BIN/helm-plugins.
plugin="$BIN/helm-plugins/unittest"
mkdir -p "$plugin"
ln -sf "$BIN/helm-unittest" "$plugin/helm-unittest"
cat >"$plugin/plugin.yaml" <<'YAML'
name: unittest
version: 1.1.2
usage: unit tests of a chart's templates
description: helm-unittest, built from the Go module proxy by hack/tools.sh
command: $HELM_PLUGIN_DIR/helm-unittest
YAML

echo "$BIN"
