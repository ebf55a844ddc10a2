#!/usr/bin/env bash
# Builds handoff's release artifacts without a container engine (make release).
#
# Usage: hack/release.sh [STEP...]
#        (default: notes images chart binaries sdk sbom checksums, in that order)
#
#   notes     DIST/notes.md: the release notes, the CHANGELOG's section of
#             VERSION (go run ./hack/releasekit notes). First, so that a
#             release whose notes are missing stops before it builds.
#   images    the base (an empty multi-arch image made with crane: no shell,
#             no libc, user 65532, an empty /tmp), then with ko the images
#             handoff (bin/handoff: webhook and CLI) and handoff-sidecar
#             (./cmd/handoff-sidecar: what injected pods run), each an OCI image
#             index over PLATFORMS with OCI labels and ko's SPDX SBOM
#             attached, signed with cosign and verified.
#   chart     charts/handoff and charts/handoff-workload packaged at
#             VERSION (version and appVersion), pushed as OCI artifacts to
#             REGISTRY/charts/NAME, signed and verified.
#   binaries  DIST/bin: handoff for BIN_PLATFORMS, each also as a krew
#             archive (kubectl-handoff-OS-ARCH.tar.gz) with the krew plugin
#             manifest handoff.yaml (hack/krew.sh; its URLs at
#             KREW_URL_BASE, default the GitHub release of VERSION), and the
#             LICENSE beside them (each krew archive holds it too).
#   sdk       DIST/sdk: the SDKs' packages at VERSION, each built offline
#             from a copy of its directory whose version is stamped there:
#             the Python SDK's sdist and wheel (python3 -m build
#             --no-isolation, Debian's python3-build), the npm packages
#             @handoff-dev/worker and @handoff-dev/bullmq (npm pack; the
#             latter's peer dependency on the former at ^VERSION), the gem
#             (sdk/ruby/build-gem.sh). VERSION in each registry's spelling:
#             go run ./hack/releasekit versions.
#   sbom      DIST/sbom/NAME.spdx.json: an SPDX SBOM of each binary and
#             each SDK package, by syft (hack/tools.sh release builds it),
#             naming VERSION.
#   checksums DIST/release: every asset made so far for VERSION, side by
#             side as on the GitHub release (binaries, krew archives and
#             manifest, LICENSE, both charts' .tgz, the SDK packages, the
#             SBOMs), their SHA-256 sums in checksums.txt (sha256sum -c reads
#             it), its cosign signature (checksums.txt.sig; SIGN=keyless:
#             checksums.txt.bundle), then all of it checked (go run
#             ./hack/releasekit verify: every file in checksums.txt, each at
#             VERSION inside); DIST/assets.txt lists each with its size and
#             SHA-256.
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
#                    127.0.0.1:25500). Empty (and a step images or chart
#                    to run): a loopback docker-registry
#                    whose storage is DIST/registry, on RELEASE_PORT
#                    (default 25001), started for the run and stopped at
#                    its end (hack/registry.sh start DIST/registry 25001
#                    serves it again). A 127.0.0.1 or localhost registry is
#                    spoken to over plain HTTP.
#   PLATFORMS        the images' platforms, comma-separated
#                    (default linux/amd64,linux/arm64).
#   BIN_PLATFORMS    the binaries' platforms, comma-separated (default
#                    linux/amd64,linux/arm64,darwin/amd64,darwin/arm64).
#   DIST             the output directory (default dist).
#   PYTHON           the Python that builds the Python SDK's packages
#                    (default /usr/bin/python3, Debian's, with the Debian
#                    packages python3-build, python3-setuptools and
#                    python3-wheel, installed if missing).
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
PYTHON=${PYTHON:-/usr/bin/python3}
SIGN=${SIGN:-key}
[[ "$SIGN" == key || "$SIGN" == keyless ]] || die "SIGN \"$SIGN\": want key or keyless"
BIN_PLATFORMS=${BIN_PLATFORMS:-linux/amd64,linux/arm64,darwin/amd64,darwin/arm64}
for p in ${BIN_PLATFORMS//,/ }; do
  [[ "$p" =~ ^(linux|darwin)/(amd64|arm64)$ ]] || die "BIN_PLATFORMS: \"$p\" is not one of linux/amd64, linux/arm64, darwin/amd64, darwin/arm64"
done
all_steps=(notes images chart binaries sdk sbom checksums)
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=("${all_steps[@]}")
registry_needed=""
for s in "${steps[@]}"; do
  [[ " ${all_steps[*]} " == *" $s "* ]] || die "step \"$s\": want one of ${all_steps[*]}"
  if [[ "$s" == images || "$s" == chart ]]; then registry_needed=1; fi
done
export COSIGN_PASSWORD=${COSIGN_PASSWORD:-}
mkdir -p "$DIST"

BIN=$(bash hack/tools.sh)
ko() { "$BIN/ko" "$@"; }
crane() { "$BIN/crane" "$@"; }
cosign() { "$BIN/cosign" "$@"; }
helm() { "$BIN/helm" "$@"; }

REGISTRY=${REGISTRY:-}
if [ -z "$REGISTRY" ] && [ -n "$registry_needed" ]; then
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
  local p os arch out
  mkdir -p "$DIST/bin"
  rm -f "$DIST"/bin/handoff-*-* "$DIST"/bin/kubectl-handoff-*.tar.gz "$DIST/bin/handoff.yaml"
  for p in ${BIN_PLATFORMS//,/ }; do
    os=${p%/*} arch=${p#*/}
    out=$DIST/bin/handoff-$os-$arch
    CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -ldflags "-s -w -X github.com/handoff-dev/handoff/version.version=$VERSION -X github.com/handoff-dev/handoff/version.commit=$COMMIT" -o "$out" ./cmd/handoff
    log "built $out"
  done
  # kubectl handoff through krew: an archive per platform and the plugin
  # manifest naming them at the GitHub release (hack/krew.sh).
  bash hack/krew.sh "$DIST/bin" "$VERSION" "${KREW_URL_BASE:-}"
  install -m 0644 LICENSE "$DIST/bin/LICENSE" # Apache-2.0, a release asset beside the binaries
}

# releasekit runs hack/releasekit (the registries' spellings of VERSION,
# the notes, the check of the assets), built once a run.
releasekit() {
  if [ -z "${RELEASEKIT:-}" ]; then
    RELEASEKIT=$DIST/.releasekit
    go build -o "$RELEASEKIT" ./hack/releasekit
  fi
  "$RELEASEKIT" "$@"
}

notes() {
  releasekit notes "$VERSION" >"$DIST/notes.md"
  log "notes: $(wc -l <"$DIST/notes.md") lines from CHANGELOG.md"
}

# need_debian PKG...: installs the Debian packages missing (as root), else
# names them.
need_debian() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "missing Debian packages ${missing[*]}: apt-get install ${missing[*]}"
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${missing[@]}" >/dev/null ||
    { apt-get update -qq >/dev/null && apt-get install -y -qq "${missing[@]}" >/dev/null; }
}

# copy_tree SRC DST: SRC's files without what its builds and tests leave.
copy_tree() {
  mkdir -p "$2"
  tar -C "$1" --exclude=node_modules --exclude=dist --exclude=build --exclude=__pycache__ \
    --exclude=.pytest_cache --exclude=.mypy_cache --exclude='*.egg-info' --exclude='*.tgz' --exclude='*.gem' \
    -cf - . | tar -C "$2" -xf -
}

sdk() {
  local out=$DIST/sdk w PYTHON_VERSION NPM_VERSION GEM_VERSION NPM_DIST_TAG
  eval "$(releasekit versions "$VERSION")"
  # The copies are built in DIST/sdk-build (left there if a build fails).
  w=$DIST/sdk-build
  rm -rf "$out" "$w" && mkdir -p "$out" "$w"
  # The packages' files carry the commit's time, not the build's.
  export SOURCE_DATE_EPOCH
  SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || date +%s)

  # Python: the version is handoff.__version__ (pyproject's dynamic
  # version), "0.0.0" in the tree, stamped here.
  need_debian python3-build python3-setuptools python3-wheel
  copy_tree sdk/python "$w/python"
  local init=$w/python/src/handoff/__init__.py
  [ "$(grep -c '^__version__ = "0.0.0"$' "$init")" = 1 ] ||
    die "sdk/python/src/handoff/__init__.py: want one line __version__ = \"0.0.0\" (the release stamps it)"
  sed -i "s/^__version__ = \"0.0.0\"\$/__version__ = \"$PYTHON_VERSION\"/" "$init"
  (cd "$w/python" && "$PYTHON" -m build --no-isolation --sdist --wheel --outdir "$out" . >"$w/python-build.log" 2>&1) ||
    { cat "$w/python-build.log" >&2; die "python3 -m build in a copy of sdk/python failed"; }
  log "built the Python SDK at $PYTHON_VERSION"

  # npm: @handoff-dev/worker and its workspace bullmq/ (@handoff-dev/bullmq),
  # "0.0.0" in the tree; bullmq's peer dependency follows the version.
  copy_tree sdk/node "$w/node"
  (
    cd "$w/node"
    npm ci --no-audit --no-fund --prefer-offline --loglevel=error >&2
    # shellcheck disable=SC2016 # JavaScript, not shell
    node -e '
      const fs = require("fs"), v = process.argv[1];
      for (const f of ["package.json", "bullmq/package.json"]) {
        const p = JSON.parse(fs.readFileSync(f, "utf8"));
        if (p.version !== "0.0.0") throw new Error(`sdk/node/${f}: version ${p.version}, want 0.0.0 (the release stamps it)`);
        p.version = v;
        if (p.peerDependencies && "@handoff-dev/worker" in p.peerDependencies) p.peerDependencies["@handoff-dev/worker"] = "^" + v;
        fs.writeFileSync(f, JSON.stringify(p, null, 2) + "\n");
      }' "$NPM_VERSION"
    npm run --silent build >&2
    npm run --silent build -w bullmq >&2
    npm pack --ignore-scripts --workspaces --include-workspace-root --pack-destination "$out" --loglevel=error >/dev/null
  ) || die "npm pack in a copy of sdk/node failed"
  log "built the npm packages at $NPM_VERSION (dist-tag $NPM_DIST_TAG)"

  # The gem: handoff.gemspec takes the version from HANDOFF_GEM_VERSION.
  need_debian ruby
  bash sdk/ruby/build-gem.sh "$out" "$VERSION" >/dev/null
  log "built the gem at $GEM_VERSION"
  rm -rf "$w"
  ls -l "$out" >&2
}

sbom() {
  local syft f name w scan
  syft=$(bash hack/tools.sh release)/syft
  rm -rf "$DIST/sbom" && mkdir -p "$DIST/sbom"
  w=$DIST/sbom-build
  for f in "$DIST"/bin/handoff-*-* "$DIST"/sdk/*; do
    [ -f "$f" ] || continue
    name=$(basename "$f")
    # The SBOM's subject is the file, named by the release (its root
    # package: the file's name at VERSION). syft reads a binary's Go build
    # information (every module at its version); a package is scanned as
    # it is installed, where syft finds its metadata: the wheel unpacked
    # (its dist-info), the sdist as it is (its PKG-INFO), the npm package
    # unpacked (its package.json), the gem installed (its specification).
    rm -rf "$w" && mkdir -p "$w"
    scan=("file:$f")
    case "$name" in
      *.whl) "$PYTHON" -m zipfile -e "$f" "$w" && scan=("dir:$w") ;;
      *.tgz) tar -C "$w" -xzf "$f" && scan=("dir:$w" --select-catalogers +javascript-package-cataloger) ;;
      *.gem)
        gem install --local --no-document --ignore-dependencies --install-dir "$w" "$f" >/dev/null &&
          scan=("dir:$w/specifications" --select-catalogers +ruby-installed-gemspec-cataloger)
        ;;
    esac
    SYFT_CHECK_FOR_APP_UPDATE=false "$syft" scan "${scan[@]}" -q \
      --source-name "$name" --source-version "$VERSION" \
      -o "spdx-json=$DIST/sbom/$name.spdx.json"
  done
  rm -rf "$w"
  log "SBOMs: $(find "$DIST/sbom" -name '*.spdx.json' | wc -l) in $DIST/sbom"
}

checksums() {
  local rel=$DIST/release f
  rm -rf "$rel" && mkdir -p "$rel"
  for f in "$DIST"/bin/handoff-*-* "$DIST"/bin/kubectl-handoff-*.tar.gz "$DIST/bin/handoff.yaml" "$DIST/bin/LICENSE" \
    "$DIST/handoff-$VERSION.tgz" "$DIST/handoff-workload-$VERSION.tgz" "$DIST"/sdk/* "$DIST"/sbom/*.spdx.json; do
    [ -f "$f" ] || continue
    ln -f "$f" "$rel/" 2>/dev/null || cp "$f" "$rel/"
  done
  [ -n "$(ls -A "$rel")" ] || die "checksums: no asset of $VERSION under $DIST (run the other steps first)"
  (cd "$rel" && sha256sum -- * >"$DIST/checksums.txt.new" && mv "$DIST/checksums.txt.new" checksums.txt)
  if [ "$SIGN" = key ]; then
    cosign sign-blob --yes "${sign_flags[@]}" --output-signature "$rel/checksums.txt.sig" "$rel/checksums.txt" >&2
    cosign verify-blob "${verify_flags[@]}" --signature "$rel/checksums.txt.sig" "$rel/checksums.txt" >&2
  else
    cosign sign-blob --yes --bundle "$rel/checksums.txt.bundle" "$rel/checksums.txt" >&2
  fi
  releasekit verify -dir "$rel" -list "$DIST/assets.txt" "$VERSION"
  cat "$DIST/assets.txt" >&2
}

for s in "${steps[@]}"; do
  start=$SECONDS
  "$s"
  log "$s: $((SECONDS - start)) s"
done
if [ -f "$env_file" ]; then
  log "done: $env_file"
  cat "$env_file" >&2
else
  log "done: $DIST"
fi
