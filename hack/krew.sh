#!/usr/bin/env bash
# Packs the handoff CLI as a kubectl plugin for krew (kubectl krew install):
# for each BINDIR/handoff-OS-ARCH, BINDIR/kubectl-handoff-OS-ARCH.tar.gz
# holding it as kubectl-handoff, and the repository's LICENSE (Apache-2.0)
# (byte for byte reproducible: owner 0, mtime 0, gzip without a name or
# time), and BINDIR/handoff.yaml, the krew plugin manifest that names each
# archive at URL_BASE with its SHA-256. The krew index takes a plugin only
# with a license file in its archives.
#
# Usage: hack/krew.sh BINDIR VERSION [URL_BASE]
#   VERSION   the release version, a semver with a leading v (v0.2.0)
#   URL_BASE  where the archives are downloaded from; default the GitHub
#             release, https://github.com/handoff-dev/handoff/releases/download/VERSION
# hack/release.sh binaries runs it; test: TestKrewInstallsTheKubectlPlugin
# (e2e).
set -euo pipefail

die() { echo "krew: $*" >&2; exit 2; }
[ $# -ge 2 ] && [ $# -le 3 ] || die "usage: hack/krew.sh BINDIR VERSION [URL_BASE]"
BINDIR=$1 VERSION=$2
URL_BASE=${3:-https://github.com/handoff-dev/handoff/releases/download/$VERSION}
[[ "$VERSION" =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$ ]] ||
  die "VERSION \"$VERSION\": want a semver with a leading v and no leading zeros, like v0.2.0"
URL_BASE=${URL_BASE%/}
[[ "$URL_BASE" =~ ^https?://[^[:space:]\#?]+$ ]] ||
  die "URL_BASE \"$URL_BASE\": want an http or https URL with no spaces, query or fragment, like https://github.com/handoff-dev/handoff/releases/download/$VERSION"
[ -d "$BINDIR" ] || die "BINDIR $BINDIR: not a directory"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$ROOT/LICENSE" ] || die "$ROOT/LICENSE: missing (every archive packs it)"

platforms=""
found=0
for bin in "$BINDIR"/handoff-*-*; do
  [ -f "$bin" ] || continue
  base=$(basename "$bin")
  [[ "$base" =~ ^handoff-(linux|darwin)-(amd64|arm64)$ ]] || continue
  os=${BASH_REMATCH[1]} arch=${BASH_REMATCH[2]}
  archive=kubectl-handoff-$os-$arch.tar.gz
  w=$(mktemp -d)
  install -m 0755 "$bin" "$w/kubectl-handoff"
  install -m 0644 "$ROOT/LICENSE" "$w/LICENSE"
  files=(LICENSE kubectl-handoff)
  tar --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -C "$w" -cf - "${files[@]}" | gzip -9 -n >"$BINDIR/$archive"
  rm -rf "$w"
  sum=$(sha256sum "$BINDIR/$archive" | cut -d' ' -f1)
  platforms+="  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: $URL_BASE/$archive
    sha256: $sum
    bin: kubectl-handoff
"
  found=$((found + 1))
done
[ "$found" -gt 0 ] || die "no handoff-OS-ARCH binary in $BINDIR (hack/release.sh binaries makes them)"

cat >"$BINDIR/handoff.yaml" <<EOF
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: handoff
spec:
  version: $VERSION
  homepage: https://github.com/handoff-dev/handoff
  shortDescription: See and check graceful handovers of Kubernetes workers
  description: |
    handoff is a sidecar that hands a worker pod's Lease and queue claims
    over when the pod stops. This plugin is its CLI: kubectl handoff status
    shows each Lease's holder, the shard map, each injected pod's phase and
    its last handover; kubectl handoff check checks an installation (the
    webhook reachable, its caBundle, each workload's Lease rights and time
    budgets); kubectl handoff inject adds the sidecar to manifests.
  platforms:
$platforms
EOF
echo "krew: $BINDIR/handoff.yaml ($found platforms)" >&2
