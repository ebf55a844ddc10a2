#!/usr/bin/env bash
# go build with progress: the same arguments as `go build` (one -o and one
# package last), but while it compiles it reports how many of the
# packages the binary needs have been compiled, so a cold build of many
# minutes is not silent. On a terminal the count is redrawn in place; in a
# log, a line every 30 s. A warm build (everything cached) prints nothing.
# Compile errors pass through as go prints them, and a failed build
# fails (pipefail: the status is go's).
#
# Usage: hack/gobuild.sh [go build flags] -o OUT PACKAGE
#        (env as for go build, e.g. CGO_ENABLED=0 GOFLAGS=-mod=mod)
set -euo pipefail

args=("$@")
[ ${#args[@]} -ge 1 ] || { echo "usage: hack/gobuild.sh [go build flags] -o OUT PACKAGE" >&2; exit 2; }
pkg=${args[-1]}
# go list takes the build flags but not -o: drop it and its value.
list=() out=$pkg
for ((i = 0; i < ${#args[@]} - 1; i++)); do
  case ${args[i]} in
    -o) i=$((i + 1)) out=${args[i]} ;;
    -o=*) out=${args[i]#-o=} ;;
    *) list+=("${args[i]}") ;;
  esac
done
# The binary's name as written (go.etcd.io/etcd/server/v3 is etcd).
name=${out##*/} name=${name%.tmp}
# The packages the binary is made of, standard library included: what a
# cold build compiles. (An error here is left to go build to report.)
total=$(go list -deps "${list[@]}" "$pkg" 2>/dev/null | wc -l) || total=0

start=$SECONDS last=$SECONDS n=0
report() {
  local what="building $name: $n of $total packages compiled, $((SECONDS - start)) s"
  if [ -t 2 ]; then printf '\r%s' "$what" >&2; else echo "$what" >&2; fi
}
# go build -v names each package as it compiles it, one import path a line
# (no spaces, no colon); anything else is go's own output, passed through.
go build -v "${args[@]}" 2>&1 | while IFS= read -r line; do
  case $line in
    *" "* | *:* | "#"* | "") [ -t 2 ] && [ $n -gt 0 ] && echo >&2; echo "$line" >&2 ;;
    *)
      n=$((n + 1))
      if [ -t 2 ] || ((SECONDS - last >= 30)); then report; last=$SECONDS; fi
      ;;
  esac
done
# A cold build ends with its time, so the first run says where it went.
if ((SECONDS - start >= 30)); then
  [ -t 2 ] && echo >&2
  echo "built $name in $((SECONDS - start)) s ($total packages)" >&2
fi
