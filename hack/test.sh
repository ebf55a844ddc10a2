#!/usr/bin/env bash
# make test: every suite in turn, each run to its end even when one before it
# failed, each timed; a summary at the end names the failed tests, and the
# exit is non-zero if any suite failed. The suites are the Makefile's
# targets: integration on the oldest supported Kubernetes (every package),
# then on the newest (the packages that talk to the API, on its
# kube-apiserver, etcd and kube-controller-manager), the Python, Node and
# Ruby SDKs (their tests and handoff conformance on their example workers),
# end to end on a real kubelet. End to end on the newest is make e2e-newest
# (in make test-newest), not run here: a cold build of the newest's node
# binaries and a second e2e run would take a cold CI run past 70 minutes.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
source hack/lib/phases.sh

phase "integration, Kubernetes oldest (go test -race ./...)" make --no-print-directory integration-oldest
phase "integration, Kubernetes newest: the packages that talk to the API (go test -race)" make --no-print-directory integration-newest
phase "the Python, Node and Ruby SDKs (sdk/python/test.sh, sdk/node/test.sh, sdk/ruby/test.sh)" make --no-print-directory sdk-test
phase "end to end on a real kubelet" make --no-print-directory e2e
phases_end
