module github.com/handoff-dev/handoff/worker

go 1.24

require (
	github.com/go-logr/logr v1.4.2
	github.com/handoff-dev/handoff/protocol v0.0.0-00010101000000-000000000000
	golang.org/x/net v0.38.0
	k8s.io/utils v0.0.0-20241104100929-3ea5e8cea738
)
