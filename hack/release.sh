#!/usr/bin/env bash
# Builds handoff's release artifacts without a container engine (make release).
#
# Usage: hack/release.sh [STEP...]      (default: images chart binaries)
#
#   images    the base (an empty multi-arch image made with crane: no shell,
#             no libc, user 65532, an empty /tmp), then with ko the images
#             handoff (bin/handoff: webhook and CLI) and handoff-sidecar
#             (./cmd/handoff-sidecar: what injected pods run), each an OCI image
#             index over PLATFORMS with OCI labels and ko's SPDX SBOM
#             attached, signed with cosign and verified.
#   chart     charts/handoff and charts/handoff-workload packaged at
#             VERSION (version and appVersion), pushed as OCI artifacts to
#             REGISTRY/charts/NAME, signed and verified.
#   binaries  handoff for linux and darwin on amd64 and arm64, each also
#             as a krew archive (kubectl-handoff-OS-ARCH.tar.gz) with the
#             krew plugin manifest handoff.yaml (hack/krew.sh; its URLs at
#             KREW_URL_BASE, default the GitHub release of VERSION), the
#             LICENSE beside them (each krew archive holds it too), their
#             SHA-256 checksums (sha256sum -c reads them) and the
#             checksums' cosign signature.
#
# Everything goes under DIST; DIST/release.env lists what was pushed, by
# digest (KEY=VALUE lines: BASE_IMAGE, HANDOFF_IMAGE, HANDOFF_SIDECAR_IMAGE,
# CHART, CHART_VERSION, CHART_DIGEST, WORKLOAD_CHART, WORKLOAD_CHART_DIGEST), DIST/images.txt each image's
# compressed size per platform, DIST/images/NAME-OS-ARCH.tar each
# platform's image as a docker-archive tarball.
#
# Environment:
#   VERSION          the release version, a semver with a leading v
#                    (v0.2.0, v0.0.0-dev.3.gabc1234): image tags, chart
#                    version and appVersion, the binaries' version.version. Required.
#   REGISTRY         where images and chart go (ghcr.io/handoff-dev,
#                    127.0.0.1:25500). Empty: a loopback docker-registry
#                    whose storage is DIST/registry, on RELEASE_PORT
#                    (default 25001), started for the run and stopped at
#                    its end (hack/registry.sh start DIST/registry 25001
#                    serves it again). A 127.0.0.1 or localhost registry is
#                    spoken to over plain HTTP.
#   PLATFORMS        the images' platforms, comma-separated
#                    (default linux/amd64,linux/arm64).
#   DIST             the output directory (default dist).
#   SIGN             key (default): cosign with DIST/cosign.key, made for
#                    the run if COSIGN_KEY is not set, no transparency log
#                    (works offline); keyless: cosign's keyless signing
#                    (OIDC, Fulcio, Rekor: the publishing workflow).
#   COSIGN_KEY       a cosign private key to sign with (SIGN=key).
#   COSIGN_PASSWORD  its password (default empty).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "release: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}

VERSION=${VERSION:-}
[[ "$VERSION" =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]] ||
  die "VERSION \"$VERSION\": want a semver with a leading v and no build metadata, like v0.2.0 or v0.0.0-dev.3.gabc1234 (it is an image tag and the chart's version)"
# .ko.yaml's ldflags read both, as the Makefile's LDFLAGS stamp them.
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || true)}
export VERSION COMMIT
PLATFORMS=${PLATFORMS:-linux/amd64,linux/arm64}
for p in ${PLATFORMS//,/ }; do
  [[ "$p" =~ ^linux/(amd64|arm64)$ ]] || die "PLATFORMS: \"$p\" is not one of linux/amd64, linux/arm64"
done
DIST=$(realpath -m "${DIST:-dist}")
SIGN=${SIGN:-key}
[[ "$SIGN" == key || "$SIGN" == keyless ]] || die "SIGN \"$SIGN\": want key or keyless"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(images chart binaries)
for s in "${steps[@]}"; do
  [[ "$s" =~ ^(images|chart|binaries)$ ]] || die "step \"$s\": want images, chart or binaries"
done
export COSIGN_PASSWORD=${COSIGN_PASSWORD:-}
mkdir -p "$DIST"

BIN=$(bash hack/tools.sh)
ko() { "$BIN/ko" "$@"; }
crane() { "$BIN/crane" "$@"; }
cosign() { "$BIN/cosign" "$@"; }
helm() { "$BIN/helm" "$@"; }

REGISTRY=${REGISTRY:-}
if [ -z "$REGISTRY" ]; then
  REGISTRY=$(bash hack/registry.sh start "$DIST/registry" "${RELEASE_PORT:-25001}")
  trap 'bash hack/registry.sh stop "$DIST/registry"' EXIT
fi
REGISTRY=${REGISTRY%/}
plain=() # flags for a registry on loopback, spoken to over HTTP
helm_plain=()
if [[ "$REGISTRY" =~ ^(127\.0\.0\.1|localhost)(:|/|$) ]]; then
  plain=(--allow-http-registry)
  helm_plain=(--plain-http)
fi

# The signing key: a private key of the caller's, or one made for this run
# (never committed: DIST is ignored by git).
sign_flags=()
verify_flags=()
if [ "$SIGN" = key ]; then
  key=${COSIGN_KEY:-}
  if [ -z "$key" ]; then
    key=$DIST/cosign.key
    if [ ! -f "$key" ]; then
      rm -f "$DIST/cosign.pub"
      cosign generate-key-pair --output-key-prefix "$DIST/cosign" >&2
    fi
  fi
  [ -f "$key" ] || die "COSIGN_KEY $key: no such file"
  pub=${key%.key}.pub
  [ -f "$pub" ] || cosign public-key --key "$key" --outfile "$pub" >&2
  sign_flags=(--key "$key" --tlog-upload=false)
  verify_flags=(--key "$pub" --insecure-ignore-tlog=true)
fi

env_file=$DIST/release.env
record() { # KEY VALUE: one line of release.env, replacing an earlier one
  touch "$env_file"
  grep -v "^$1=" "$env_file" >"$env_file.new" || true
  echo "$1=$2" >>"$env_file.new"
  mv "$env_file.new" "$env_file"
}

sign() { # REF@DIGEST: sign, then verify with the public key (SIGN=key)
  cosign sign --yes "${sign_flags[@]}" "${plain[@]}" --recursive "$1" >&2
  if [ "$SIGN" = key ]; then
    cosign verify "${verify_flags[@]}" "${plain[@]}" "$1" >/dev/null
    log "signed and verified $1"
  fi
}

# base pushes the empty multi-arch base and prints its index by digest.
base() {
  local w layer refs=() p
  w=$(mktemp -d)
  mkdir -m 1777 "$w/tmp"
  tar --numeric-owner --owner=0 --group=0 --mtime=@0 -C "$w" -cf "$w/base.tar" tmp
  layer=$(crane append --oci-empty-base -f "$w/base.tar" -t "$REGISTRY/handoff-base:layer")
  for p in ${PLATFORMS//,/ }; do
    # No labels here: the images inherit the base's.
    refs+=(-m "$(crane mutate "$layer" --set-platform "$p" --user 65532:65532 --workdir / \
      -t "$REGISTRY/handoff-base:${p//\//-}")")
  done
  rm -rf "$w"
  local dig
  dig=$(crane index append --tag "$REGISTRY/handoff-base:$VERSION" "${refs[@]}")
  echo "$REGISTRY/handoff-base@${dig##*@}"
}

# sizes appends each platform's compressed size of image REF@DIGEST to
# DIST/images.txt.
sizes() {
  local ref=$1 p bytes
  for p in ${PLATFORMS//,/ }; do
    bytes=$(crane manifest --platform "$p" "$ref" | jq '[.layers[].size] | add')
    printf '%s\t%s\t%s bytes\t%.1f MiB compressed\n' "${ref%@*}" "$p" "$bytes" "$(jq -n "$bytes/1048576")" >>"$DIST/images.txt"
  done
}

images() {
  local base_ref commit created labels ref
  base_ref=$(base)
  record BASE_IMAGE "$base_ref"
  commit=$(git rev-parse HEAD)
  created=$(git log -1 --format=%ct)
  labels=(
    --image-label "org.opencontainers.image.source=https://github.com/handoff-dev/handoff"
    --image-label "org.opencontainers.image.version=$VERSION"
    --image-label "org.opencontainers.image.revision=$commit"
    --image-label "org.opencontainers.image.vendor=handoff"
    --image-label "org.opencontainers.image.licenses=Apache-2.0"
    # (ko splits a label flag at commas: none in the values)
  )
  : >"$DIST/images.txt"
  local name title p
  for name in handoff handoff-sidecar; do
    title="handoff: the webhook and the CLI"
    if [ "$name" = handoff-sidecar ]; then
      title="handoff-sidecar: the sidecar of injected pods (also their install step and preStop hook)"
    fi
    local start=$SECONDS
    # SOURCE_DATE_EPOCH: the images' creation time is the commit's, so
    # a build of one commit gives the same digests.
    # Each image is its own main package: ./cmd/handoff, ./cmd/handoff-sidecar.
    ref=$(SOURCE_DATE_EPOCH=$created \
      KO_DOCKER_REPO="$REGISTRY/$name" KO_DEFAULTBASEIMAGE="$base_ref" \
      ko build "./cmd/$name" --bare --tags "$VERSION" --platform "$PLATFORMS" --sbom spdx \
      --image-user 65532:65532 "${labels[@]}" --image-label "org.opencontainers.image.title=$title")
    log "built $ref in $((SECONDS - start)) s"
    sign "$ref"
    sizes "$ref"
    # Each platform's image as a docker-archive tarball too (ctr images
    # import, docker load, kind load image-archive), as cert-manager ships,
    # named REGISTRY/NAME:VERSION inside (pulled by the tag: by the digest,
    # crane would name it NAME:i-was-a-digest).
    mkdir -p "$DIST/images"
    for p in ${PLATFORMS//,/ }; do
      crane pull --platform "$p" "${ref%@*}" "$DIST/images/$name-${p//\//-}.tar"
    done
    local key=HANDOFF_IMAGE
    [ "$name" = handoff-sidecar ] && key=HANDOFF_SIDECAR_IMAGE
    record "$key" "$ref"
  done
  cat "$DIST/images.txt" >&2
}

# push_chart NAME: charts/NAME packaged at VERSION, pushed to
# REGISTRY/charts/NAME and signed; prints its digest.
push_chart() {
  local name=$1 tgz out dig
  helm package "charts/$name" --version "$VERSION" --app-version "$VERSION" -d "$DIST" >&2
  tgz=$DIST/$name-$VERSION.tgz
  out=$(helm push "$tgz" "oci://$REGISTRY/charts" "${helm_plain[@]}" 2>&1) || die "helm push: $out"
  echo "$out" >&2
  dig=$(sed -n 's/^Digest: //p' <<<"$out")
  [ -n "$dig" ] || die "helm push of $name printed no digest"
  sign "$REGISTRY/charts/$name@$dig"
  echo "$dig"
}

# The platform's chart, and handoff-workload, which app teams install in
# their own namespaces (rbac.selfService).
chart() {
  local dig
  dig=$(push_chart handoff)
  record CHART "oci://$REGISTRY/charts/handoff"
  record CHART_VERSION "$VERSION"
  record CHART_DIGEST "$dig"
  dig=$(push_chart handoff-workload)
  record WORKLOAD_CHART "oci://$REGISTRY/charts/handoff-workload"
  record WORKLOAD_CHART_DIGEST "$dig"
}

binaries() {
  local os arch out
  mkdir -p "$DIST/bin"
  for os in linux darwin; do
    for arch in amd64 arm64; do
      out=$DIST/bin/handoff-$os-$arch
      CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -ldflags "-s -w -X github.com/handoff-dev/handoff/version.version=$VERSION -X github.com/handoff-dev/handoff/version.commit=$COMMIT" -o "$out" ./cmd/handoff
      log "built $out"
    done
  done
  # kubectl handoff through krew: an archive per platform and the plugin
  # manifest naming them at the GitHub release (hack/krew.sh).
  bash hack/krew.sh "$DIST/bin" "$VERSION" "${KREW_URL_BASE:-}"
  install -m 0644 LICENSE "$DIST/bin/LICENSE" # Apache-2.0, a release asset beside the binaries
  (cd "$DIST/bin" && sha256sum handoff-* kubectl-handoff-* handoff.yaml LICENSE >checksums.txt)
  local sig=$DIST/bin/checksums.txt.sig
  if [ "$SIGN" = key ]; then
    cosign sign-blob --yes "${sign_flags[@]}" --output-signature "$sig" "$DIST/bin/checksums.txt" >&2
    cosign verify-blob "${verify_flags[@]}" --signature "$sig" "$DIST/bin/checksums.txt" >&2
  else
    cosign sign-blob --yes --bundle "$DIST/bin/checksums.txt.bundle" "$DIST/bin/checksums.txt" >&2
  fi
}

for s in "${steps[@]}"; do
  start=$SECONDS
  "$s"
  log "$s: $((SECONDS - start)) s"
done
log "done: $env_file"
cat "$env_file" >&2
