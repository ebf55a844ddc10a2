module github.com/handoff-dev/handoff/worker/redisstreams

go 1.24

require (
	github.com/go-logr/logr v1.4.2
	github.com/handoff-dev/handoff/worker v0.0.0-00010101000000-000000000000
	github.com/redis/go-redis/v9 v9.7.3
)

require (
	github.com/cespare/xxhash/v2 v2.2.0 // indirect
	github.com/dgryski/go-rendezvous v0.0.0-20200823014737-9f7001d12a5f // indirect
	github.com/handoff-dev/handoff/protocol v0.0.0-00010101000000-000000000000 // indirect
	golang.org/x/net v0.38.0 // indirect
	k8s.io/utils v0.0.0-20241104100929-3ea5e8cea738 // indirect
)
