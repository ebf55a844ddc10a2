#!/usr/bin/env bash
# A cluster to try the README's quickstart on: the e2e cluster (a real
# kubelet on containerd, e2e/cluster/up.sh) with a release of this checkout
# in a loopback registry, and the worker the quickstart enables, as
# TestQuickstart prepares it (e2e/quickstart_test.go).
#
# Usage: hack/sandbox.sh up|down [DIR]   (root; DIR defaults to
#                                         $TMPDIR/handoff-sandbox, /tmp's)
#
# up, about 5 minutes warm:
#   - starts Debian's docker-registry on 127.0.0.1:25600 (hack/registry.sh);
#   - builds and pushes the images handoff and handoff-sidecar and the two
#     charts at this checkout's version (hack/release.sh images chart, for
#     this machine's platform, signed with a key made in DIR/dist), and with
#     ko the example worker (examples/pgworker) and the node's pause image;
#   - builds the release's CLI for this machine, DIR/bin/handoff;
#   - boots the cluster (e2e/cluster/up.sh DIR/cluster);
#   - starts PostgreSQL on 127.0.0.1 and on the pods' bridge address
#     10.89.0.1, port 25650 (hack/postgres.sh), for the example worker;
#   - creates namespace shop and in it Deployment orders: two replicas of
#     the example worker on the namespace's default service account,
#     unlabelled, with its leader work on the Lease orders-leader. Its pods
#     do not start until the quickstart enables handoff: the SDK refuses to
#     run without the sidecar's token.
# It then prints what the quickstart needs (KUBECONFIG, PATH with kubectl
# and helm, HANDOFF_VERSION, HANDOFF_CHARTS, the flags for a build of your
# own), also kept in DIR/sandbox.env. If up fails, it stops what it started.
#
# down stops what up started, each by the PID its script recorded: the
# cluster (e2e/cluster/down.sh, which also undoes its host changes),
# PostgreSQL and the registry; then removes what it made in DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=${GOTOOLCHAIN:-go1.27.3} # as the Makefile builds
log() { echo "sandbox: $*" >&2; }

REGISTRY_PORT=25600 PG_PORT=25650 HOST_IP=10.89.0.1 # the host on up.sh's pod bridge
cmd=${1:-}
DIR=$(realpath -m "${2:-${TMPDIR:-/tmp}/handoff-sandbox}")

down() {
  bash e2e/cluster/down.sh "$DIR/cluster" || log "e2e/cluster/down.sh $DIR/cluster failed"
  bash hack/postgres.sh stop "$DIR/pg" || log "hack/postgres.sh stop $DIR/pg failed"
  bash hack/registry.sh stop "$DIR/registry" || log "hack/registry.sh stop $DIR/registry failed"
  if [ -f "$DIR/cluster/pids" ]; then
    log "the cluster was not stopped; kept $DIR (run e2e/cluster/down.sh $DIR/cluster)"
    return 1
  fi
  # What up made, by name: DIR itself may be one of the caller's.
  rm -rf "${DIR:?}"/{registry,dist,bin,cluster,pg,sandbox.env}
  rmdir "$DIR" 2>/dev/null || true
  log "stopped; removed its files from $DIR"
}

up() {
  [ "$(id -u)" -eq 0 ] || { log "up boots a kubelet: run it as root"; exit 1; }
  if [ -e "$DIR/sandbox.env" ] || [ -f "$DIR/cluster/pids" ]; then
    log "$DIR already has a sandbox: hack/sandbox.sh down $DIR first"
    exit 1
  fi
  mkdir -p "$DIR"
  chmod 755 "$DIR" # PostgreSQL runs as its own user
  trap 'log "up failed or was interrupted; stopping what it started"; down; exit 1' ERR INT TERM

  local registry version arch tools kubectl out ref pgworker pause url
  registry=$(bash hack/registry.sh start "$DIR/registry" "$REGISTRY_PORT")
  version=$(bash hack/version.sh)
  arch=$(go env GOARCH)
  log "building release $version into $registry (hack/release.sh images chart)"
  REGISTRY=$registry PLATFORMS=linux/$arch DIST=$DIR/dist VERSION=$version SIGN=key COSIGN_KEY='' \
    bash hack/release.sh images chart >&2
  # shellcheck disable=SC1091 # written by hack/release.sh: KEY=VALUE lines
  source "$DIR/dist/release.env"

  tools=$(bash hack/tools.sh)
  log "building the example worker and the pause image with ko"
  out=$(KO_DOCKER_REPO=$registry/examples KO_DEFAULTBASEIMAGE=$BASE_IMAGE \
    "$tools/ko" build -B --platform "linux/$arch" --sbom none ./examples/pgworker ./e2e/cluster/pause)
  for ref in $out; do # REPO[:TAG]@sha256:DIGEST; the pods name REPO@sha256:DIGEST
    case "$ref" in
      "$registry/examples/pgworker"[:@]*) pgworker=$registry/examples/pgworker@${ref#*@} ;;
      "$registry/examples/pause"[:@]*) pause=$registry/examples/pause@${ref#*@} ;;
    esac
  done
  if [[ "${pgworker:-}" != *@sha256:* || "${pause:-}" != *@sha256:* ]]; then
    log "ko build printed \"$out\": want $registry/examples/pgworker and …/pause by sha256 digest"
    false
  fi
  log "building the release's CLI into $DIR/bin/handoff"
  CGO_ENABLED=0 go build -trimpath -o "$DIR/bin/handoff" \
    -ldflags "-s -w -X github.com/handoff-dev/handoff/version.version=$version -X github.com/handoff-dev/handoff/version.commit=$(git rev-parse HEAD)" ./cmd/handoff

  KUBECONFIG=$(HANDOFF_E2E_REGISTRY=$registry HANDOFF_E2E_PAUSE_IMAGE=$pause bash e2e/cluster/up.sh "$DIR/cluster")
  export KUBECONFIG
  url=$(HANDOFF_PG_LISTEN=$HOST_IP bash hack/postgres.sh start "$DIR/pg" "$PG_PORT")
  url=${url/127.0.0.1/$HOST_IP} # as the pods reach it

  kubectl=$(bash hack/kube-assets.sh kubectl)
  "$kubectl/kubectl" create namespace shop >&2
  "$kubectl/kubectl" -n shop apply -f - >&2 <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: orders}
spec:
  replicas: 2
  selector: {matchLabels: {app: orders}}
  template:
    metadata: {labels: {app: orders}}
    spec:
      terminationGracePeriodSeconds: 10
      containers:
        - name: worker
          image: $pgworker
          imagePullPolicy: IfNotPresent
          args: [--database-url, "$url", --lease, orders-leader]
EOF
  trap - ERR INT TERM

  cat >"$DIR/sandbox.env" <<EOF
# The sandbox of hack/sandbox.sh in $DIR (stop it: hack/sandbox.sh down $DIR).
# Source this file, then run the README's quickstart.
export KUBECONFIG=$KUBECONFIG
# kubectl $("$kubectl/kubectl" version --client | sed -n 's/^Client Version: //p') and the pinned helm $("$tools/helm" version --short):
export PATH=$kubectl:$tools:\$PATH
# The quickstart's variables for this build (NAMESPACE=shop,
# DEPLOYMENT=orders and LEASE=orders-leader are its defaults):
export HANDOFF_VERSION=$version
export HANDOFF_CHARTS=oci://$registry/charts
# A build of your own: add to step 1
#   --set image.repository=$registry/handoff --set sidecar.image.repository=$registry/handoff-sidecar
# (helm speaks plain HTTP to a registry on 127.0.0.1 by itself; one elsewhere
# needs --plain-http on each helm install).
# kubectl handoff: the release's CLI, $DIR/bin/handoff, on PATH as kubectl-handoff.
# shop/orders's pods crash-loop until step 3: the SDK does not run without
# the sidecar's token.
EOF
  cat "$DIR/sandbox.env"
}

case "$cmd" in
  up) up ;;
  down) down ;;
  *)
    log "usage: hack/sandbox.sh up|down [DIR]"
    exit 2
    ;;
esac
