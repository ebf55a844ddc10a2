#!/usr/bin/env bash
# Builds the handoff gem offline (gem build, no network) from a copy of
# sdk/ruby, so the tree gets no .gem file, and prints the gem's path.
#
#   bash sdk/ruby/build-gem.sh OUTDIR [VERSION]
#
# VERSION is the release's (v0.2.0, v0.3.0-rc.1; default the gemspec's
# 0.0.0): RubyGems spells a prerelease 0.3.0.pre.rc.1. make release calls
# it with DIST/sdk and VERSION, then checksums and signs the .gem with the
# other release files (hack/release.sh sdk); sdk/ruby/test.sh builds with
# it too.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:?usage: build-gem.sh OUTDIR [VERSION]}
version=${2:-}
mkdir -p "$out"
out=$(cd "$out" && pwd)
src=$(mktemp -d /tmp/handoff-gem.XXXXXX)
trap 'rm -rf "$src"' EXIT
tar -C "$here" --exclude='*.gem' -cf - . | tar -C "$src" -xf -
(cd "$src" && HANDOFF_GEM_VERSION=$version gem build handoff.gemspec >"$src/build.log" 2>&1) || { cat "$src/build.log" >&2; exit 1; }
g=$(ls "$src"/handoff-*.gem)
mv "$g" "$out/"
echo "$out/$(basename "$g")"
