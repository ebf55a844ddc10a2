#!/usr/bin/env bash
# Runs every fuzz target for FUZZTIME each (default 10s), one after the
# other, and fails if any finds a crash. A crash's input is written under
# <package>/testdata/fuzz/<target>/: commit it with the fix, and the plain
# `go test` run keeps checking it. The first build of each target is slow
# (coverage instrumentation).
#
#   hack/fuzz.sh                       # every target, 10s each
#   FUZZTIME=5m hack/fuzz.sh           # longer
#   FUZZTIME=1000x hack/fuzz.sh        # or a count of executions
#   hack/fuzz.sh ./inject:FuzzManifests  # one target
#   FUZZPARALLEL=1 hack/fuzz.sh        # fuzz workers (default GOMAXPROCS)
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME=${FUZZTIME:-10s}

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
	# Every Fuzz function in a fuzz_test.go, as ./pkg:Name.
	mapfile -t targets < <(grep -o '^func Fuzz[A-Za-z0-9_]*' $(find . -name fuzz_test.go -not -path './.git/*') /dev/null |
		sed -E 's#^(\./)?(.*)/fuzz_test\.go:func (Fuzz[A-Za-z0-9_]*)$#./\2:\3#' | sort)
fi
if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzz: no fuzz targets found" >&2
	exit 1
fi

parallel=()
[ -n "${FUZZPARALLEL:-}" ] && parallel=(-parallel "$FUZZPARALLEL")

failed=()
start=$SECONDS
for t in "${targets[@]}"; do
	pkg=${t%%:*} name=${t##*:}
	echo "== fuzz $pkg $name for $FUZZTIME"
	t0=$SECONDS
	# -run '^$': the package's other tests ran in the plain go test run.
	if go test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "${parallel[@]}" "$pkg"; then
		echo "== $pkg $name: ok ($((SECONDS - t0))s)"
	else
		echo "== $pkg $name: FAILED ($((SECONDS - t0))s); the input is under $pkg/testdata/fuzz/$name/" >&2
		failed+=("$t")
	fi
done
echo "== fuzz: ${#targets[@]} targets in $((SECONDS - start))s"
if [ ${#failed[@]} -gt 0 ]; then
	echo "fuzz: failed: ${failed[*]}" >&2
	exit 1
fi
