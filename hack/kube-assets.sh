#!/usr/bin/env bash
# Builds etcd and kube-apiserver, and the extra binaries asked for (like
# kubectl), from the Go module proxy and caches them by version, so envtest
# (KUBEBUILDER_ASSETS) and the demo have a real control plane on a machine
# with no download site but the module proxy.
#
# Usage: hack/kube-assets.sh [extra-binary...]   (e.g. kubectl kubelet kube-scheduler)
# Prints the assets directory on stdout. Idempotent: a cached binary is kept.
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.35.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
CACHE=${HANDOFF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/handoff}
out="$CACHE/kube/$KUBE_VERSION-etcd-$ETCD_VERSION"
mkdir -p "$out"

log() { echo "kube-assets: $*" >&2; }
here=$(cd "$(dirname "$0")" && pwd)

want=(kube-apiserver "$@")
missing=()
for b in "${want[@]}"; do [ -x "$out/$b" ] || missing+=("$b"); done

if [ ${#missing[@]} -gt 0 ] || [ ! -x "$out/etcd" ]; then
  # One build at a time per version (two test packages, or make targets run
  # side by side, would share the wrapper module); the one that waited
  # finds the binaries built and builds only what is still missing.
  exec 9>"$out/.lock"
  flock 9
  missing=()
  for b in "${want[@]}"; do [ -x "$out/$b" ] || missing+=("$b"); done
fi

if [ ${#missing[@]} -gt 0 ]; then
  work="$CACHE/build/kubernetes-$KUBE_VERSION"
  mkdir -p "$work"
  # .ready marks a complete wrapper module; a half-made one is made again.
  if [ ! -f "$work/.ready" ]; then
    log "preparing wrapper module for k8s.io/kubernetes $KUBE_VERSION (downloads its modules from the Go module proxy: a minute or two the first time)"
    (cd "$work" && rm -f go.mod go.sum tools.go && go mod init handoff.local/kubebuild >/dev/null 2>&1)
    dir=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
    # kubernetes' own replace block points every staging module at ./staging;
    # point them at the published tag of the same minor instead.
    staging=${KUBE_VERSION/v1./v0.}
    {
      echo "require k8s.io/kubernetes $KUBE_VERSION"
      awk '/^replace \(/{r=1;next} r&&/^\)/{r=0} r&&$1~/^k8s.io\//{print "replace " $1 " => " $1 " '"$staging"'"}' "$dir/go.mod"
    } >>"$work/go.mod"
    cat >"$work/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
    # One "go: downloading" line per module (about 190) would bury the
    # progress: they go to a log, shown only if tidy fails.
    if ! (cd "$work" && GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>"$work/tidy.log"); then
      cat "$work/tidy.log" >&2
      exit 1
    fi
    log "downloaded $(grep -c '^go: downloading' "$work/tidy.log" || true) modules"
    touch "$work/.ready"
  fi
  minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION"
  for b in "${missing[@]}"; do
    [ "$b" = etcd ] && continue
    log "building $b $KUBE_VERSION (cold: minutes; progress below)"
    (cd "$work" && CGO_ENABLED=0 GOFLAGS=-mod=mod bash "$here/gobuild.sh" -trimpath -ldflags "$ldflags" -o "$out/$b.tmp" "k8s.io/kubernetes/cmd/$b") && mv "$out/$b.tmp" "$out/$b"
  done
fi

if [ ! -x "$out/etcd" ]; then
  work="$CACHE/build/etcd-$ETCD_VERSION"
  mkdir -p "$work"
  log "building etcd $ETCD_VERSION (cold: minutes; progress below)"
  (
    cd "$work"
    [ -f go.mod ] || go mod init handoff.local/etcdbuild >/dev/null 2>&1
    GOFLAGS=-mod=mod go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "go.etcd.io/etcd/api/v3@$ETCD_VERSION" \
      "go.etcd.io/etcd/client/pkg/v3@$ETCD_VERSION" "go.etcd.io/etcd/client/v3@$ETCD_VERSION" "go.etcd.io/etcd/pkg/v3@$ETCD_VERSION" >/dev/null 2>&1
    CGO_ENABLED=0 GOFLAGS=-mod=mod bash "$here/gobuild.sh" -trimpath -ldflags "-s -w" -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3
  ) && mv "$out/etcd.tmp" "$out/etcd"
fi

echo "$out"
