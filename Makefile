# handoff — the README's two commands are `make demo` and `make test`.
SHELL := /bin/bash
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)

.PHONY: all build demo test unit lint kube-assets tools clean

all: build

build:
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o bin/handoff ./cmd/handoff
	CGO_ENABLED=0 go build -trimpath -o bin/pgworker ./examples/pgworker

# Builds or reuses the control-plane binaries (cached under ~/.cache/handoff).
kube-assets:
	@bash hack/kube-assets.sh >/dev/null

tools:
	@bash hack/tools.sh >/dev/null

# A real handover with its timeline, beside the same replacement without handoff.
demo: build kube-assets
	go run ./examples/demo --handoff bin/handoff --worker bin/pgworker

# Every test: unit, and integration against a real kube-apiserver + etcd and
# a real PostgreSQL, which the tests start themselves.
test: kube-assets
	KUBEBUILDER_ASSETS=$$(bash hack/kube-assets.sh) go test -race -count=1 ./...

unit:
	go test -count=1 ./config ./worker

lint: tools
	gofmt -l . | (! grep .)
	go vet ./...
	$$(bash hack/tools.sh)/golangci-lint run ./...

clean:
	rm -rf bin .run
