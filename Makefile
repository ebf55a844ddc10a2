# handoff — the README's two commands are `make demo` and `make test`.
SHELL := /bin/bash
# The release version, from the git tag (hack/version.sh: vX.Y.Z on a tagged
# commit, vX.Y.Z-dev.N.gSHA between tags), stamped into both binaries with
# the commit; the image tags and the chart take the same VERSION. Override
# it as `make release VERSION=v0.2.0`.
# (Worked out once, as `VERSION ?=` would on every use.)
ifeq ($(origin VERSION),undefined)
VERSION := $(shell bash hack/version.sh)
endif
ifeq ($(VERSION),)
$(error VERSION: hack/version.sh printed none (see its error above); set VERSION=vX.Y.Z)
endif
ifeq ($(origin COMMIT),undefined)
COMMIT := $(shell git rev-parse HEAD 2>/dev/null)
endif
LDFLAGS := -s -w -X github.com/handoff-dev/handoff/version.version=$(VERSION) -X github.com/handoff-dev/handoff/version.commit=$(COMMIT)
# The images' platforms in make release (make image: this machine's).
PLATFORMS ?= linux/amd64,linux/arm64

# The Go toolchain of every build, test and tool here: go1.27.3, which fixes
# standard-library vulnerabilities of go1.26 that govulncheck finds reachable
# from bin/handoff (`make vuln`). The go command takes it from the Go module
# proxy on first use (go.mod still says 1.26, so the packages build with an
# older Go too).
GOTOOLCHAIN ?= go1.27.3
export GOTOOLCHAIN

# The Kubernetes versions the integration suite runs against, the oldest and
# the newest supported: kube-apiserver and the etcd it ships with. make test
# (and so CI) runs on both; the e2e kubelet in make e2e is the oldest's, and
# make e2e-newest (before a release) runs on the newest.
KUBE_OLDEST := KUBE_VERSION=v1.35.4 ETCD_VERSION=v3.6.16
KUBE_NEWEST := KUBE_VERSION=v1.37.2 ETCD_VERSION=v3.7.3
# Every package of the repository's modules (go.work): ./... holds the
# main module's alone; the protocol, the Go SDK and its adapters are modules
# of their own.
GO_PKGS := ./... ./protocol/... ./worker/... ./worker/jetstream/... ./worker/rabbitmq/... ./worker/redisstreams/... ./worker/river/...
# The packages whose tests talk to the apiserver (their tests import
# internal/kubetest; docs' TestAPIPackagesAreTheMakefiles checks the list),
# run again on the newest.
API_PKGS := ./cmd/handoff ./deploy ./examples/pgworker ./leaderelection ./sidecar ./webhook ./webhook/outcomes

.PHONY: all build image release release-snapshot deploy demo sandbox sandbox-down test test-newest integration integration-oldest integration-newest e2e e2e-newest e2e-assets rollout-figures successor-figures shard-figures queue-figures roundtrip sdk-test queue-servers soak nemesis unit bench fuzz lint vuln kube-assets kube-assets-newest tools clean

## Builds the binaries (make with no target)
all: build

# Static builds, through hack/gobuild.sh: a cold build reports how far it
# has got (a warm one prints nothing more than go build).
GOBUILD := CGO_ENABLED=0 bash hack/gobuild.sh -trimpath
BUILD_SIDECAR = $(GOBUILD) -ldflags "$(LDFLAGS)" -o bin/handoff-sidecar ./cmd/handoff-sidecar
BUILD_PGWORKER = $(GOBUILD) -o bin/pgworker ./examples/pgworker

## Builds bin/handoff, its sidecar and the example workers (static)
build:
	$(GOBUILD) -ldflags "$(LDFLAGS)" -o bin/handoff ./cmd/handoff
	$(BUILD_SIDECAR)
	$(BUILD_PGWORKER)
	$(GOBUILD) -o bin/riverworker ./examples/riverworker

## Builds the images for this machine into bin/image
# The images handoff and handoff-sidecar for this machine's platform, built
# with ko without a container engine into a loopback registry whose storage
# is bin/image/registry, and as docker-archive tarballs in bin/image/images
# (hack/release.sh images; signed with a key made in bin/image).
image: tools
	PLATFORMS=linux/$$(go env GOARCH) DIST=bin/image VERSION=$(VERSION) bash hack/release.sh images

## Builds the signed release artifacts into dist/ (docs/releasing.md)
# The release artifacts under dist/ (docs/releasing.md), all at VERSION:
# the release notes from the CHANGELOG; the images handoff and
# handoff-sidecar for PLATFORMS, each an OCI image index with OCI labels and
# an SPDX SBOM, signed with cosign (a key made into dist/ unless COSIGN_KEY
# names one) and verified; the charts as OCI artifacts; handoff for linux
# and darwin on amd64 and arm64 with its krew archives; the SDK packages
# (Python sdist and wheel, npm @handoff-dev/worker and @handoff-dev/bullmq,
# the gem); an SBOM of each binary and package (syft, built here on first
# use, about 9 minutes cold); every file in dist/release with its SHA-256
# in a signed checksums.txt, checked. REGISTRY unset: pushed to a
# loopback registry whose storage is dist/registry (hack/release.sh).
release: tools
	VERSION=$(VERSION) PLATFORMS=$(PLATFORMS) bash hack/release.sh

## Runs the release test with SBOMs (builds syft if missing)
# TestReleaseSnapshot (hack/releasekit; in make test too, where it leaves
# the SBOMs out while syft is not built): hack/release.sh into a scratch
# directory, every asset checked at its version and installed from its
# file. Here with the sbom step, building syft first if missing.
release-snapshot: tools
	HANDOFF_RELEASE_SBOM=1 go test -count=1 -timeout 40m -run 'TestReleaseSnapshot' -v ./hack/releasekit

## Renders the Helm chart into deploy/handoff.yaml
# deploy/handoff.yaml: the Helm chart rendered as plain manifests.
deploy: tools
	KUBEBUILDER_ASSETS=$$(bash hack/kube-assets.sh) go test ./deploy -run TestManifestsAreTheChartRendered -update

## Builds or reuses the oldest supported Kubernetes's control-plane binaries
# Builds or reuses the control-plane binaries of the oldest supported
# Kubernetes that the integration suite runs (kube-apiserver, etcd,
# kube-controller-manager; cached under ~/.cache/handoff). make e2e builds
# the node's binaries beside them.
kube-assets:
	@$(KUBE_OLDEST) bash hack/kube-assets.sh kube-controller-manager >/dev/null

## Builds or reuses the newest supported Kubernetes's control-plane binaries
# The same of the newest supported Kubernetes, for make integration-newest:
# only kube-apiserver, its etcd and kube-controller-manager, not the node's
# binaries (make e2e-newest builds those); cached under ~/.cache/handoff.
# What a cold build costs: docs/development.md.
kube-assets-newest:
	@$(KUBE_NEWEST) bash hack/kube-assets.sh kube-controller-manager >/dev/null

## Installs or reuses the pinned tools (hack/tools.sh)
tools:
	@bash hack/tools.sh >/dev/null

## Runs a real handover beside one without handoff, with its timeline
# A real handover with its timeline, beside the same replacement without
# handoff. It builds only what it runs: the sidecar's binary, the example
# worker, the demo, and kube-apiserver and etcd of the oldest supported
# Kubernetes (cached under ~/.cache/handoff; not the controller manager, not
# the newest version's, which the tests use).
demo:
	$(BUILD_SIDECAR)
	$(BUILD_PGWORKER)
	$(GOBUILD) -o bin/demo ./examples/demo
	@$(KUBE_OLDEST) bash hack/kube-assets.sh >/dev/null
	bin/demo --handoff bin/handoff-sidecar --worker bin/pgworker --svg bin/demo-timeline.svg $(DEMO_ARGS)

## Boots a cluster to try the README's quickstart on (root; hack/sandbox.sh)
# The e2e cluster (a real kubelet on containerd) with a release of this
# checkout in a loopback registry, PostgreSQL, and the Deployment shop/orders
# of the example worker the quickstart enables; prints the quickstart's
# variables. SANDBOX_DIR defaults to $TMPDIR/handoff-sandbox.
sandbox: tools
	bash hack/sandbox.sh up $(SANDBOX_DIR)

## Stops the sandbox and everything make sandbox started
sandbox-down:
	bash hack/sandbox.sh down $(SANDBOX_DIR)

## Runs every suite: integration (oldest and newest Kubernetes), the SDKs, end to end (hack/test.sh)
# Every test: unit and integration on the oldest supported Kubernetes, the
# packages that talk to the API again on the newest, then the SDKs and end
# to end on a real kubelet. Each suite runs to its end even when one before
# it failed; hack/test.sh times each and lists the failed tests at the end.
test:
	@bash hack/test.sh

## Runs the Go tests on the oldest and newest supported Kubernetes
# Unit, and integration against a real kube-apiserver + etcd (and
# kube-controller-manager) and a real PostgreSQL, which the tests start:
# every package on the oldest supported Kubernetes, then the packages that
# talk to the apiserver on the newest (kubetest checks the server's version).
integration: integration-oldest integration-newest

## Runs every Go test (-race) on the oldest supported Kubernetes
integration-oldest: kube-assets queue-servers
	$(KUBE_OLDEST) KUBEBUILDER_ASSETS=$$($(KUBE_OLDEST) bash hack/kube-assets.sh kube-controller-manager) go test -race -count=1 $(GO_PKGS)

## Runs the apiserver tests on the newest supported Kubernetes
integration-newest: kube-assets-newest queue-servers
	$(KUBE_NEWEST) KUBEBUILDER_ASSETS=$$($(KUBE_NEWEST) bash hack/kube-assets.sh kube-controller-manager) go test -race -count=1 $(API_PKGS)

## Runs integration and e2e on the newest Kubernetes (before a release)
# Every suite that runs on Kubernetes, on the newest supported (1.37):
# integration (the packages that talk to the API, as make test does) and
# end to end. The e2e half is not in make test, so not in CI: the node's
# binaries of a second Kubernetes and a second e2e run would take a cold CI
# run past 70 minutes (docs/development.md, "Which Kubernetes the tests run
# on").
# Run before each release (docs/releasing.md).
test-newest: integration-newest e2e-newest

## Tests the Python, Node and Ruby SDKs, with conformance on their workers
# The SDKs for Python, Node and Ruby (sdk/python, sdk/node, sdk/ruby):
# their own tests, type checks and packages, and handoff conformance on
# their example workers, with the handoff binary built once here.
sdk-test:
	$(GOBUILD) -ldflags "$(LDFLAGS)" -o bin/handoff ./cmd/handoff
	HANDOFF_BIN=$(CURDIR)/bin/handoff bash sdk/python/test.sh
	HANDOFF_BIN=$(CURDIR)/bin/handoff bash sdk/node/test.sh
	HANDOFF_BIN=$(CURDIR)/bin/handoff bash sdk/ruby/test.sh

## Installs or builds the queue servers the adapters' tests run on
# The queue servers the adapters' tests run on, installed or built and
# cached before the tests, so a cold build is not inside a test's timeout.
queue-servers:
	@bash hack/nats-server.sh >/dev/null

## Measures per queue how soon a leaving worker's claim is reclaimed
# Per queue system: an unfinished claim claimed again after a leaving
# worker's drain deadline, with the adapter and with the queue's own timeout.
queue-figures: queue-servers
	bash hack/queue-figures.sh

## Measures the sidecar's calls to the app per SDK (p50, p99)
# The sidecar's calls to the app per SDK (Go, Python threaded and asyncio,
# Node): p50 and p99 beside Go's, and the 2 ms target (bench/roundtrip).
roundtrip:
	bash hack/roundtrip.sh

## Measures the figures of docs/performance.md on a real kube-apiserver + etcd
# The figures of docs/performance.md, on a real kube-apiserver + etcd: Lease
# handover and API cost beside plain client-go, the sidecar's memory, CPU and
# shutdown time, many Leases over many sidecars (scale), and the webhook's
# admission latency.
bench: build image kube-assets
	KUBEBUILDER_ASSETS=$$(bash hack/kube-assets.sh) go run ./bench/takeover
	KUBEBUILDER_ASSETS=$$(bash hack/kube-assets.sh) go run ./bench/sidecar --handoff bin/handoff-sidecar --image bin/image/images/handoff-sidecar-linux-$$(go env GOARCH).tar
	KUBEBUILDER_ASSETS=$$(bash hack/kube-assets.sh) go run ./bench/scale --handoff bin/handoff-sidecar
	KUBEBUILDER_ASSETS=$$(bash hack/kube-assets.sh) go run ./bench/footprint --handoff bin/handoff-sidecar -variant 'handoff (all)=bin/handoff'
	KUBEBUILDER_ASSETS=$$(bash hack/kube-assets.sh kube-controller-manager) go test -run '^$$' -bench Admission -benchtime 2000x ./webhook
	KUBEBUILDER_ASSETS=$$(bash hack/kube-assets.sh) go test -run '^$$' -bench 'ListInjected|PickStaleness' -benchtime 60x ./sidecar

## Runs the end-to-end suite on a real kubelet (root; boots its own cluster)
# End to end on a real kubelet (root; boots and stops its own cluster with
# e2e/cluster, containerd and runc from Debian), or on the cluster named by
# HANDOFF_E2E_KUBECONFIG (see e2e/e2e_test.go). The race detector is on in
# the test process (the pods' binaries are built without it), which shares
# the build cache with lint and integration.
e2e: e2e-assets
	go test -race -tags e2e -count=1 -v -timeout 40m ./e2e/

## Runs the end-to-end suite on the newest supported Kubernetes
# The same end-to-end suite on the newest supported Kubernetes (apiserver,
# controllers and kubelet 1.37; part of test-newest, not in make test or CI).
e2e-newest: tools
	$(KUBE_NEWEST) bash hack/kube-assets.sh kubectl kube-controller-manager kube-scheduler kube-proxy kubelet >/dev/null
	$(KUBE_NEWEST) go test -race -tags e2e -count=1 -v -timeout 40m ./e2e/

## Measures the rollout figures, handoff beside the baseline, from one e2e run
# The rollout figures, handoff beside the baseline, from one e2e run:
# printed, and drawn as a picture in bin/rollout-figures.svg.
rollout-figures: e2e-assets
	bash e2e/rollout-figures.sh $(SCRAPE_INTERVAL)

## Measures the role Lease's moves per rollout, successor named beside the race
# The successor figures (docs/performance.md, "One move per rollout"):
# rollouts of 3 and 5 replicas with the successor named, and the same with
# prefer-successor false as the baseline, in one e2e run.
successor-figures: e2e-assets
	bash e2e/successor-figures.sh

## Measures the shard figures (docs/shards.md) from one e2e run
# The shard figures (docs/shards.md) from one e2e run: a rollout restart of
# 3 replicas over 12 shard Leases under load.
shard-figures: e2e-assets
	bash e2e/shard-figures.sh

## Runs SOAK_RUNS rollout restarts in a row under load on a real kubelet
# The soak: SOAK_RUNS rollout restarts in a row under load on a real kubelet,
# with what each lost, applied twice or overlapped, and its handover time.
SOAK_RUNS ?= 20
soak: e2e-assets
	bash e2e/soak.sh $(SOAK_RUNS)

## Runs the nemesis: fault schedules from seeds on a real cluster, the history checked
# The nemesis: NEMESIS_SEEDS fault schedules (default 1-30: seeds 1 to 30;
# one seed replays its schedule) of NEMESIS_FAULTS faults (default 10) in
# NEMESIS_WINDOW (default 2m), from NEMESIS_KINDS (default all), on the
# cluster e2e/cluster boots, under load with rollouts going on; the
# recorded history checked. See e2e/nemesis.sh.
NEMESIS_SEEDS ?= 1-30
NEMESIS_FAULTS ?= 10
NEMESIS_WINDOW ?= 2m
NEMESIS_KINDS ?= all
nemesis: e2e-assets
	bash e2e/nemesis.sh $(NEMESIS_SEEDS) $(NEMESIS_FAULTS) $(NEMESIS_WINDOW) $(NEMESIS_KINDS)

## Builds what the e2e tests run: the pinned tools and the node's binaries
# What the e2e tests run, built before a test's timeout starts: the pinned
# tools, and the node's binaries unless the cluster is given.
e2e-assets: tools
	@[ -n "$$HANDOFF_E2E_KUBECONFIG" ] || bash hack/kube-assets.sh kubectl kube-controller-manager kube-scheduler kube-proxy kubelet >/dev/null

## Runs every fuzz target for FUZZTIME each (default 10s)
# Every fuzz target for FUZZTIME each (default 10s), in turn; fails on a
# crash. Their seed corpora also run in the plain go test run.
fuzz:
	bash hack/fuzz.sh

## Runs every Go test that needs no server or root (-short, fast)
# Every module's packages (GO_PKGS) under go test -short: the tests that
# need a real server, a control plane (envtest) or root skip themselves
# there (internal/servertest and the packages on it, kubetest); make
# integration runs them. Under two minutes once the build cache is warm.
unit:
	go test -short -count=1 $(GO_PKGS)

## Runs gofmt, go vet, golangci-lint, and the module, chart and workflow checks
# vet and golangci-lint load the packages built with -race, as every test
# here is: the packages they compile into the build cache are the tests'
# (a cold CI run compiled them twice, 4 minutes of it).
lint: tools
	gofmt -l . | (! grep .)
	go vet -race $(GO_PKGS)
	go vet -race -tags e2e ./e2e/
	GOFLAGS="$$GOFLAGS -race" $$(bash hack/tools.sh)/golangci-lint run $(GO_PKGS)
	bash hack/modules.sh
	bash hack/chartlint.sh
	$$(bash hack/tools.sh)/actionlint .github/workflows/*.yml

## Finds known vulnerabilities reachable from the shipped binary (govulncheck)
# Known vulnerabilities reachable from the shipped binary (govulncheck,
# offline, with the vulnerability database from the Go module proxy).
vuln: tools
	bash hack/vuln.sh

## Removes bin, .run and dist
clean:
	rm -rf bin .run dist

## Lists the targets with what each does (the ## line above each)
# A target's summary is the comment line that starts with "## " in the block
# above it; the "# " lines after it say more.
.PHONY: help
help:
	@echo 'Usage: make [TARGET]   (no target: build)'
	@awk '/^## /{doc = substr($$0, 4); next} /^$$/{doc = ""} /^[a-zA-Z0-9_-]+:/ && doc != "" {t = $$0; sub(/:.*/, "", t); printf "  %-18s %s\n", t, doc; doc = ""}' $(firstword $(MAKEFILE_LIST))
