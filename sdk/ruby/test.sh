#!/usr/bin/env bash
# Checks the Ruby SDK (sdk/ruby): an offline build of the gem, installed
# (gem install --local) into a scratch GEM_HOME; the minitest tests, with
# handoff conformance on examples/worker.rb and examples/fixture.rb run on
# that installed gem (copies outside the tree, GEM_HOME and GEM_PATH the
# scratch one, no -I of lib/), Handoff::Sidekiq on a real Sidekiq (Debian's
# ruby-sidekiq) and a real Redis (hack/redis.sh, on a free port), a handover
# between two Sidekiq processes each beside a real sidecar. Exits non-zero on
# any failure or skipped test.
#
#   bash sdk/ruby/test.sh
#
# Environment:
#   HANDOFF_BIN  a handoff binary; unset, one is built with go
#   GEM_OUT      a directory to leave the built gem in
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d /tmp/handoff-rbsdk.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

step() { printf '\n== %s\n' "$*"; }

step "Debian packages: ruby, ruby-sidekiq, redis-server"
missing=()
for p in ruby ruby-sidekiq redis-server; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -qq "${missing[@]}" >/dev/null ||
    { $sudo apt-get update -qq >/dev/null && $sudo apt-get install -y -qq "${missing[@]}" >/dev/null; }
fi
ruby --version

if [ -z "${HANDOFF_BIN:-}" ]; then
  step "building the handoff binary"
  command -v go >/dev/null || { echo "test.sh: go not found: set HANDOFF_BIN to a handoff binary" >&2; exit 1; }
  (cd "$root" && go build -o "$tmp/handoff" ./cmd/handoff)
  export HANDOFF_BIN=$tmp/handoff
fi
echo "HANDOFF_BIN=$HANDOFF_BIN"

step "ruby -w: every file parses"
for f in "$here"/lib/*.rb "$here"/lib/handoff/*.rb "$here"/examples/*.rb "$here"/test/*.rb; do
  ruby -wc "$f" >/dev/null
done

step "gem build (offline)"
g=$(bash "$here/build-gem.sh" "$tmp/gem")
echo "built $(basename "$g")"
test "$(bash "$here/build-gem.sh" "$tmp/gem-rc" v1.2.3-rc.1 | xargs basename)" = handoff-1.2.3.pre.rc.1.gem
tar -xOf "$g" data.tar.gz | tar tzf - >"$tmp/gem.txt"
for f in LICENSE README.md CHANGELOG.md lib/handoff.rb lib/handoff/sidekiq.rb lib/handoff/testing.rb; do
  grep -qx "$f" "$tmp/gem.txt" || { echo "test.sh: the gem has no $f" >&2; exit 1; }
done
# Installed from the built gem into a scratch GEM_HOME, loaded from there.
GEM_HOME=$tmp/gemhome gem install --local --no-document "$g" >/dev/null
GEM_HOME=$tmp/gemhome GEM_PATH=$tmp/gemhome ruby -e '
  require "handoff"; require "handoff/testing"
  raise "loaded #{$LOADED_FEATURES.grep(/handoff\.rb/).inspect}" unless $LOADED_FEATURES.grep(%r{/handoff\.rb\z}).first.start_with?(ENV["GEM_HOME"])
  a = Handoff::Agent.new(insecure_no_token: true)
  puts "gem #{Handoff::VERSION} installed and loaded; instance #{a.instance}"'
if [ -n "${GEM_OUT:-}" ]; then
  mkdir -p "$GEM_OUT"
  cp "$g" "$GEM_OUT/"
  echo "left $(basename "$g") in $GEM_OUT"
fi

step "minitest: unit, conformance (on the gem in $tmp/gemhome), Sidekiq (a real Sidekiq and Redis), the handover"
(cd "$here" && HANDOFF_SDK_GEM_HOME=$tmp/gemhome ruby -Itest -e 'Dir["test/*_test.rb"].sort.each { |f| require File.expand_path(f) }' -- --verbose) |
  tee "$tmp/tests.out" | grep -v -E '^(Sidekiq|Handoff|Auth|Wire|Agent|Conformance)[A-Za-z]*Test#.* = [0-9.]+ s = \.$' || true
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "test.sh: a test failed" >&2; exit 1; }
summary=$(grep -E '^[0-9]+ runs, ' "$tmp/tests.out" | tail -1)
grep -q ' 0 failures, 0 errors, 0 skips$' <<<"$summary" || { echo "test.sh: $summary: want no failure and no skip" >&2; exit 1; }
# The conformance run was on the installed gem.
grep -q "installed handoff: $tmp/gemhome/gems/handoff-" "$tmp/tests.out" ||
  { echo "test.sh: the conformance run did not use the gem installed in $tmp/gemhome" >&2; exit 1; }

step "sdk/ruby: ok"
