#!/usr/bin/env bash
# Prints handoff's release version, the one source of every version it
# carries (the binaries' -ldflags, the image tags, the chart's version and
# appVersion, the injector's default image and the handoff.dev/version of
# injected pods): the git tag.
#
#   HEAD tagged vX.Y.Z (or vX.Y.Z-PRE), clean tree   vX.Y.Z
#   N commits after the tag vX.Y.Z                   vX.Y.(Z+1)-dev.N.gSHA
#   N commits after the tag vX.Y.Z-PRE               vX.Y.Z-PRE.dev.N.gSHA
#   no tag (N commits in all)                        v0.0.0-dev.N.gSHA
#   any of these with uncommitted changes            a -dev. form, + .dirty
#   no git (a source archive)                        v0.0.0-dev
#
# Every form is a semantic version (semver.org) that sorts after the tag
# it comes from and before the next release, as Go's pseudo-versions do, so
# the chart can carry it; none has build metadata ("+"), which neither an
# image tag nor a label value may hold. SHA is the abbreviated commit; a
# tree is dirty when a tracked file is changed or an untracked file is not
# ignored (as go build's vcs.modified). Only tags matching v* count; the
# nearest one that is not a semantic version is an error.
#
# Usage: hack/version.sh   (from anywhere in the repository)
set -euo pipefail

cd "$(dirname "$0")/.."
if ! git rev-parse --verify --quiet HEAD >/dev/null 2>&1; then
  echo v0.0.0-dev
  exit 0
fi

semver='^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-([0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*))?$'
sha=$(git rev-parse --short HEAD)
dirty=""
[ -z "$(git status --porcelain 2>/dev/null)" ] || dirty=".dirty"

tag=$(git describe --tags --match 'v*' --abbrev=0 HEAD 2>/dev/null || true)
if [ -z "$tag" ]; then
  echo "v0.0.0-dev.$(git rev-list --count HEAD).g$sha$dirty"
  exit 0
fi
if ! [[ "$tag" =~ $semver ]]; then
  echo "hack/version.sh: tag $tag: not a semantic version; want vMAJOR.MINOR.PATCH or vMAJOR.MINOR.PATCH-PRERELEASE, like v0.2.0 or v0.2.0-rc.1 (or a tag not matching v*)" >&2
  exit 1
fi
commits=$(git rev-list --count "$tag..HEAD")
if [ "$commits" = 0 ] && [ -z "$dirty" ]; then
  echo "$tag"
  exit 0
fi
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]} patch=${BASH_REMATCH[3]} pre=${BASH_REMATCH[5]}
if [ -n "$pre" ]; then
  echo "v$major.$minor.$patch-$pre.dev.$commits.g$sha$dirty"
else
  echo "v$major.$minor.$((patch + 1))-dev.$commits.g$sha$dirty"
fi
