#!/usr/bin/env bash
# Checks the Python SDK (sdk/python): mypy --strict, the tests, an offline
# build of the wheel and the sdist, handoff conformance on both example
# workers run on that wheel installed in a fresh venv (pip install --no-index,
# no system site-packages; the workers and `python3 -m handoff.testing` run
# with -I from copies outside the tree, so src/ is not on sys.path), the
# Celery integration in real Celery workers (RabbitMQ and Redis started here,
# a handover between two workers each beside a real sidecar). Exits non-zero
# on any failure; prints each step's time.
#
#   bash sdk/python/test.sh
#
# Environment:
#   PYTHON       the interpreter (default /usr/bin/python3, Debian's)
#   HANDOFF_BIN  a handoff binary for the conformance runs; unset, one is built
#                with go (GOTOOLCHAIN, GOMODCACHE, GOCACHE are honoured)
#   HANDOFF_SDK_OLDEST  an interpreter of the oldest Python supported (3.9) to
#                run the tests with too; default python3.9 if on PATH, "none" to skip
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d /tmp/handoff-pysdk.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
failed=0
summary=()

now() { date +%s.%N; }
# step NAME CMD...: runs CMD, records its time and result, goes on after a failure.
step() {
	local name=$1 t0 t1 rc
	shift
	echo "=== $name"
	t0=$(now)
	set +e
	"$@"
	rc=$?
	set -e
	t1=$(now)
	local took
	took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1fs", b - a }')
	if [ "$rc" -eq 0 ]; then
		summary+=("ok    $took  $name")
	else
		summary+=("FAIL  $took  $name (exit $rc)")
		failed=1
	fi
	echo "--- $name: exit $rc in $took"
}

packages() {
	local missing=() p
	# python3-celery brings kombu and py-amqp; python3-redis is the Redis
	# transport and the example's ledger. hack/redis.sh and hack/rabbitmq.sh
	# install redis-server and rabbitmq-server when they start them.
	# python3-venv and python3-pip: the venv the conformance run installs the wheel in.
	for p in mypy python3-pytest python3-yaml python3-pip python3-venv python3-build python3-setuptools python3-wheel python3-celery python3-redis; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && { echo "Debian packages present"; return 0; }
	echo "installing ${missing[*]}"
	local sudo=""
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get install -y -qq "${missing[@]}" >/dev/null ||
		{ $sudo apt-get update -qq >/dev/null && $sudo apt-get install -y -qq "${missing[@]}" >/dev/null; }
}

handoff_bin() {
	if [ -n "${HANDOFF_BIN:-}" ]; then
		echo "using HANDOFF_BIN=$HANDOFF_BIN"
		[ -x "$HANDOFF_BIN" ]
		return
	fi
	command -v go >/dev/null || { echo "go not found: set HANDOFF_BIN to a handoff binary" >&2; return 1; }
	(cd "$root" && go build -o "$tmp/handoff" ./cmd/handoff)
	HANDOFF_BIN=$tmp/handoff
	echo "built $HANDOFF_BIN"
}

typecheck() {
	(cd "$here" && "$PYTHON" -m mypy --strict --python-version 3.9 src && MYPYPATH=src "$PYTHON" -m mypy --strict --python-version 3.9 examples)
}

unit_tests() {
	(cd "$here" && PYTHONPATH=src "$PYTHON" -m pytest -q -p no:cacheprovider tests --ignore=tests/test_conformance.py \
		--ignore=tests/test_celery.py --ignore=tests/test_celery_handover.py)
}

celery_tests() {
	# -s: the handover's figures; -rs: why a test was skipped (none may be).
	(cd "$here" && HANDOFF_BIN=$HANDOFF_BIN PYTHONPATH=src "$PYTHON" -m pytest -s -q -rs -p no:cacheprovider \
		-W ignore::DeprecationWarning tests/test_celery.py tests/test_celery_handover.py) | tee "$tmp/celery.out"
	[ "${PIPESTATUS[0]}" -eq 0 ] || return 1
	! grep -q "^SKIPPED" "$tmp/celery.out" || { echo "a Celery test was skipped" >&2; return 1; }
}

# venv PY DIR: a fresh venv of PY in DIR (no system site-packages) with the
# built wheel installed by pip, offline; checks that it imports handoff from DIR.
venv() {
	local py=$1 dir=$2 whl
	whl=$(ls "$tmp"/dist/handoff-*.whl) || return 1
	"$py" -m venv --without-pip "$dir" || return 1
	# Debian's pip installs into the venv (--python): no pip bootstrapped in each venv.
	"$PYTHON" -m pip --python "$dir/bin/python" install --quiet --no-index --no-deps --disable-pip-version-check "$whl" || return 1
	(cd / && "$dir/bin/python" -I -c '
import sys, handoff, handoff.testing
assert handoff.__file__.startswith(sys.argv[1] + "/"), handoff.__file__
print("installed", handoff.__version__, "at", handoff.__file__)' "$dir")
}

conformance() {
	venv "$PYTHON" "$tmp/venv" || return 1
	# -s: the suite's table of cases, for each example worker; -rs: why a test was skipped.
	# HANDOFF_SDK_PYTHON: the workers and the fixture run on the venv's copy.
	(cd "$here" && HANDOFF_BIN=$HANDOFF_BIN HANDOFF_SDK_PYTHON=$tmp/venv/bin/python PYTHONPATH=src "$PYTHON" -m pytest -s -q -rs -p no:cacheprovider \
		tests/test_conformance.py) | tee "$tmp/conformance.out"
	[ "${PIPESTATUS[0]}" -eq 0 ] || return 1
	! grep -q "^SKIPPED" "$tmp/conformance.out" || { echo "a conformance run was skipped" >&2; return 1; }
	# Both workers ran on the installed copy, not src/.
	[ "$(grep -c "installed handoff: $tmp/venv/" "$tmp/conformance.out")" -eq 2 ] ||
		{ echo "test.sh: the conformance run did not use the wheel installed in $tmp/venv" >&2; return 1; }
}

oldest() {
	local py=${HANDOFF_SDK_OLDEST:-} c
	if [ "$py" = none ]; then
		echo "skipped (HANDOFF_SDK_OLDEST=none)"
		return 0
	fi
	if [ -z "$py" ]; then
		for c in python3.9 $(command -v pyenv >/dev/null && ls -d "$(pyenv root)"/versions/3.9*/bin/python3 2>/dev/null); do
			if "$c" -c 'import sys; assert sys.version_info[:2] == (3, 9)' 2>/dev/null; then
				py=$c
				break
			fi
		done
		if [ -z "$py" ]; then
			echo "no Python 3.9 found: skipped (set HANDOFF_SDK_OLDEST to one)"
			return 0
		fi
	fi
	echo "with $py"
	"$py" -c 'import sys; assert sys.version_info[:2] == (3, 9), sys.version' || return 1
	# Debian's pytest is pure Python; below 3.11 it imports the exceptiongroup
	# backport, which a stand-in replaces (the SDK itself never uses it).
	mkdir -p "$tmp/shim"
	cat >"$tmp/shim/exceptiongroup.py" <<'EOF'
class BaseExceptionGroup(BaseException):
    def __init__(self, msg, excs):
        super().__init__(msg, excs)
        self.message, self.exceptions = msg, tuple(excs)
class ExceptionGroup(BaseExceptionGroup, Exception):
    pass
EOF
	# The unit tests on src/; the conformance run on the wheel in a 3.9 venv.
	venv "$py" "$tmp/venv39" || return 1
	(cd "$here" && HANDOFF_BIN=$HANDOFF_BIN HANDOFF_SDK_PYTHON=$tmp/venv39/bin/python PYTHONPATH="src:$tmp/shim:/usr/lib/python3/dist-packages" "$py" -m pytest -q -p no:cacheprovider tests \
		--ignore=tests/test_celery.py --ignore=tests/test_celery_handover.py)
}

build() {
	# Built from a copy, so the tree gets no build/ or egg-info.
	mkdir -p "$tmp/src" "$tmp/dist"
	tar -C "$here" --exclude=__pycache__ --exclude=.pytest_cache --exclude=.mypy_cache --exclude=build --exclude=dist --exclude='*.egg-info' -cf - . | tar -C "$tmp/src" -xf -
	(cd "$tmp/src" && "$PYTHON" -m build --no-isolation --wheel --sdist --outdir "$tmp/dist" . >"$tmp/build.log" 2>&1) || { cat "$tmp/build.log"; return 1; }
	ls -l "$tmp/dist"
	local whl
	whl=$(ls "$tmp"/dist/handoff-*.whl)
	mkdir -p "$tmp/wheel"
	(cd "$tmp/wheel" && "$PYTHON" -m zipfile -e "$whl" .)
	test -f "$tmp/wheel/handoff/py.typed"
	# The Apache-2.0 LICENSE (a copy of the repository's) in both.
	find "$tmp/wheel" -path '*.dist-info/*' -name 'LICENSE*' -print -quit | grep -q . || { echo "test.sh: the wheel has no LICENSE" >&2; return 1; }
	(cd "$tmp" && PYTHONPATH="$tmp/wheel" "$PYTHON" -c '
import handoff, handoff.aio, handoff.protocol, handoff.testing, handoff.celery
assert handoff.__file__.startswith("'"$tmp"'/wheel/"), handoff.__file__
assert handoff.celery.__file__.startswith("'"$tmp"'/wheel/"), handoff.celery.__file__
a = handoff.Agent(insecure_no_token=True)
print("wheel", handoff.__version__, "imports; instance", a.instance)
')
	tar tzf "$tmp"/dist/handoff-*.tar.gz >"$tmp/sdist.txt"
	grep -q "tests/test_conformance.py" "$tmp/sdist.txt"
	grep -q "/LICENSE$" "$tmp/sdist.txt" || { echo "test.sh: the sdist has no LICENSE" >&2; return 1; }
}

step "debian packages" packages
step "handoff binary" handoff_bin
step "mypy --strict" typecheck
step "pytest (unit)" unit_tests
step "wheel and sdist (offline)" build
if [ -n "${HANDOFF_BIN:-}" ]; then
	step "conformance (worker.py, aio_worker.py) on the wheel in a fresh venv" conformance
	step "celery (RabbitMQ and Redis, a handover between two sidecars)" celery_tests
	step "pytest on Python 3.9" oldest
fi

echo
echo "=== summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
