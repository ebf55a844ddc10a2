#!/usr/bin/env bash
# Makes a release's commit and tags every Go module of the repository at
# its version (docs/releasing.md): one version for all of them.
#
# Usage: hack/release-modules.sh VERSION     (VERSION: v0.2.0, v0.2.0-rc.1)
#
# On a clean working tree whose tags do not hold VERSION yet:
#  1. go run ./hack/modrelease require VERSION: every go.mod requires the
#     repository's other modules at VERSION (in place of the last release's
#     version), each go.sum holds their hashes as the module proxy will
#     serve them from the tags, and go.work replaces VERSION of each with
#     its directory;
#  2. hack/modules.sh checks the result (no replace, one version, tidy);
#  3. one commit, "release VERSION: ...";
#  4. an annotated tag per module at that commit, the one the go command
#     looks the version up by: VERSION for the root module
#     (github.com/handoff-dev/handoff; this tag also starts the release
#     workflow), DIR/VERSION for the module in DIR: protocol/VERSION,
#     worker/VERSION, worker/jetstream/VERSION, ... (each module go.work
#     uses).
# Nothing is pushed; it prints the push command. TAG_SIGN=1 signs the tags
# (git tag -s) instead of annotating them.
set -euo pipefail
cd "$(dirname "$0")/.."
die() {
  echo "release-modules: $*" >&2
  exit 1
}

VERSION=${1:-}
[[ "$VERSION" =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$ ]] ||
  die "VERSION \"$VERSION\": want a semantic version with a leading v and no build metadata, like v0.2.0 or v0.2.0-rc.1"
[ -z "$(git status --porcelain)" ] || die "the working tree has changes (git status); commit or stash them first"

tags=()
for dir in $(go work edit -json | sed -n 's/.*"DiskPath": "\(.*\)".*/\1/p'); do
  dir=${dir#./}
  if [ "$dir" = . ]; then tags+=("$VERSION"); else tags+=("$dir/$VERSION"); fi
done
for tag in "${tags[@]}"; do
  ! git rev-parse --verify --quiet "refs/tags/$tag" >/dev/null || die "tag $tag exists already"
done

go run ./hack/modrelease require "$VERSION"
bash hack/modules.sh
git add -u
git commit -q -m "release $VERSION: the modules require each other at $VERSION" \
  -m "hack/release-modules.sh: every go.mod's requirement on another of the repository's modules, its go.sum lines and go.work's replace directives at $VERSION; tagged ${tags[*]}."
flag=-a
[ "${TAG_SIGN:-}" != 1 ] || flag=-s
for tag in "${tags[@]}"; do
  git tag "$flag" -m "$tag" "$tag"
done
echo "release-modules: committed $(git rev-parse --short HEAD) and tagged ${tags[*]}" >&2
echo "release-modules: publish with: git push origin HEAD ${tags[*]}" >&2
