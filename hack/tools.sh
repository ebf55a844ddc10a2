#!/usr/bin/env bash
# Installs the project's pinned Go tools into $HANDOFF_CACHE/bin
# (default ~/.cache/handoff/bin), each only if that version is missing, and
# prints the bin directory on stdout. Everything else goes to stderr.
#
# Usage: bin=$(hack/tools.sh) && "$bin/golangci-lint" run ./...
#        bin=$(hack/tools.sh release)   (also the release-only tools: syft)
#
# Tools are built from the Go module proxy with `go install`, so this works
# wherever `go` can reach the proxy (or has the modules cached).
set -euo pipefail

# One tool a line: name=module/path/to/cmd@version. name is the binary that
# `go install` produces (the last element of the package path). A tool whose
# own go.mod has replace directives, which `go install` refuses, lists them
# after a "|" (old version => new version, separated by ";"); it is built in a
# wrapper module that repeats them. Words after the package are flags of
# its `go install` (build tags).
TOOLS='
golangci-lint=github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0
helm=helm.sh/helm/v3/cmd/helm@v3.22.0
govulncheck=golang.org/x/vuln/cmd/govulncheck@v1.9.0
kubeconform=github.com/yannh/kubeconform/cmd/kubeconform@v0.8.0
helm-unittest=github.com/helm-unittest/helm-unittest/cmd/helm-unittest@v1.1.2|github.com/vmware-labs/yaml-jsonpath v0.3.2 => github.com/helm-unittest/yaml-jsonpath v0.4.0
ko=github.com/google/ko@v0.19.1
crane=github.com/google/go-containerregistry/cmd/crane@v0.22.1
cosign=github.com/sigstore/cosign/v2/cmd/cosign@v2.6.5
actionlint=github.com/rhysd/actionlint/cmd/actionlint@v1.7.12
prometheus=github.com/prometheus/prometheus/cmd/prometheus@v0.316.0 -tags=remove_all_sd,enable_kubernetes_sd
promtool=github.com/prometheus/prometheus/cmd/promtool@v0.316.0 -tags=remove_all_sd,enable_kubernetes_sd
krew=sigs.k8s.io/krew/cmd/krew@v0.4.3
validate-krew-manifest=sigs.k8s.io/krew/cmd/validate-krew-manifest@v0.4.3
# The NetworkPolicy firewall of the e2e cluster (e2e/cluster/up.sh), never shipped:
# v2.1.0 is the only version the module proxy here serves.
kube-router=github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@v2.1.0
'

# Tools only a release needs (hack/release.sh sbom, make release, the
# release workflow), installed by `hack/tools.sh release` alone: CI's test
# path never builds them. syft writes the SBOMs of the binaries and SDK
# packages; a cold build of it takes about 9 minutes on 2 cores
# (docs/releasing.md, "The SBOMs").
RELEASE_TOOLS='
syft=github.com/anchore/syft/cmd/syft@v1.57.2
'
case "${1:-}" in
  "") ;;
  release) TOOLS+=$RELEASE_TOOLS ;;
  *) echo "tools: unknown argument \"$1\": want none, or release (also the release-only tools)" >&2; exit 2 ;;
esac

# Every tool is built by the Go the Makefile pins, whatever the caller's
# shell says: a stamp records the Go that built a tool, so callers on two
# Gos would each rebuild every tool in turn (an hour cold).
GOTOOLCHAIN=$(sed -n 's/^GOTOOLCHAIN ?= *//p' "$(dirname "$0")/../Makefile")
[[ -n "$GOTOOLCHAIN" ]] || { echo "tools: no 'GOTOOLCHAIN ?= goX.Y.Z' line in the Makefile" >&2; exit 1; }
export GOTOOLCHAIN

CACHE=${HANDOFF_CACHE:-$HOME/.cache/handoff}
BIN="$CACHE/bin"
mkdir -p "$BIN"

log() { echo "tools: $*" >&2; }
# One install at a time (make lint, the tests and e2e all call this; two at
# once would build into the same wrapper module).
exec 9>"$BIN/.lock"
flock 9
goversion=$(go env GOVERSION)

while IFS= read -r line; do
  [[ -z "$line" || "$line" == \#* ]] && continue
  name=${line%%=*}
  rest=${line#*=}
  pkg=${rest%%|*}
  replaces=""
  [[ "$rest" == *"|"* ]] && replaces=${rest#*|}
  flags=()
  if [[ "$pkg" == *" "* ]]; then
    read -ra flags <<<"${pkg#* }"
    pkg=${pkg%% *}
  fi
  version=${pkg##*@}
  # A stamp beside the binary records the version installed and the Go that
  # built it, so a bumped pin or toolchain reinstalls (an analyser built with
  # an older Go cannot read packages written for a newer one) and an
  # unchanged one costs nothing.
  stamp="$BIN/.$name.version"
  want="$version $goversion${flags[*]:+ ${flags[*]}}"
  if [[ -x "$BIN/$name" && -f "$stamp" && "$(<"$stamp")" == "$want" ]]; then
    continue
  fi
  log "installing $name $version"
  if [[ -z "$replaces" ]]; then
    # GOFLAGS is reset: a caller's -mod=vendor would make `go install m@v` fail.
    GOBIN="$BIN" GOFLAGS=-mod=mod go install "${flags[@]}" "$pkg" >&2
  else
    work="$CACHE/build/$name-$version"
    rm -rf "$work" && mkdir -p "$work"
    (
      cd "$work"
      go mod init handoff.local/tools >/dev/null 2>&1
      IFS=';' read -ra reps <<<"$replaces"
      for r in "${reps[@]}"; do echo "replace $r" >>go.mod; done
      GOFLAGS=-mod=mod go get "${pkg%@*}@$version" >&2
      CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o "$BIN/$name" "${pkg%@*}" >&2
    )
  fi
  echo "$want" >"$stamp"
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
