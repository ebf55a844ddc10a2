module github.com/handoff-dev/handoff/worker/jetstream

go 1.24.13

require (
	github.com/handoff-dev/handoff/worker v0.0.0-00010101000000-000000000000
	github.com/nats-io/nats.go v1.48.0
)

require (
	github.com/go-logr/logr v1.4.2
	github.com/handoff-dev/handoff/protocol v0.0.0-00010101000000-000000000000 // indirect
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/nats-io/nkeys v0.4.15 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.48.0 // indirect
	golang.org/x/net v0.50.0 // indirect
	golang.org/x/sys v0.41.0 // indirect
	k8s.io/utils v0.0.0-20241104100929-3ea5e8cea738 // indirect
)
