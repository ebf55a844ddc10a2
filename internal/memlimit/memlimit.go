// Package memlimit gives the Go runtime a soft memory limit from the
// container's memory limit, which the injector passes to the sidecar
// through the downward API (EnvVar), so that the collector works harder as
// the sidecar nears its limit rather than letting garbage take it there.
//
// The runtime gets Share of the container's limit: 3/4. The rest is for
// what the container's memory cgroup counts and the runtime does not: the
// binary's file-backed pages (about 21 MiB resident for the sidecar build,
// reclaimable), the kernel's memory for sockets (about 3.7 KiB a
// connection, at most 2.1 MiB for the capped listeners of internal/cli/serve),
// and the page cache of files the sidecar reads. At the injected 128 MiB
// that is 96 MiB for the runtime and 32 MiB beside it; at 64 MiB, 48 and
// 16. A soft limit is not a cap: live memory past it is not refused, the
// collector runs more often (up to about half the CPU); the connection
// caps are what bound a flood.
package memlimit

import (
	"fmt"
	"math"
	"runtime/debug"
	"strconv"
)

// EnvVar holds the container's memory limit in bytes, a whole number: the
// downward API's resourceFieldRef limits.memory with the default divisor
// 1. Without a limit on the container, the downward API gives the node's
// allocatable memory.
const EnvVar = "HANDOFF_MEMORY_LIMIT"

// Share of the container's limit that the runtime gets: ShareNum/ShareDen.
const (
	ShareNum = 3
	ShareDen = 4
)

// Result says what Set did, for the start log.
type Result struct {
	// Limit is the runtime's soft memory limit in bytes after Set;
	// math.MaxInt64 when none is set.
	Limit int64
	// Container is the container's limit in bytes from EnvVar; 0 when not
	// read.
	Container int64
	// Source is where Limit came from: EnvVar, "GOMEMLIMIT" (set by the
	// user; the runtime read it at start and Set leaves it), or "" (neither
	// set: no limit).
	Source string
}

// Set sets the runtime's soft memory limit (runtime/debug.SetMemoryLimit)
// to Share of the container's limit in EnvVar, read with lookup. It
// leaves the limit alone when GOMEMLIMIT is set (non-empty) or EnvVar is
// unset. An EnvVar that is not a whole number of bytes from 1 is an error
// naming it and the accepted form, and nothing is set.
func Set(lookup func(string) (string, bool)) (Result, error) {
	if v, ok := lookup("GOMEMLIMIT"); ok && v != "" {
		return Result{Limit: debug.SetMemoryLimit(-1), Source: "GOMEMLIMIT"}, nil
	}
	raw, ok := lookup(EnvVar)
	if !ok {
		return Result{Limit: debug.SetMemoryLimit(-1)}, nil
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n < 1 {
		return Result{}, fmt.Errorf("%s: invalid value %q: want the container's memory limit in bytes, a whole number from 1 to %d (the downward API's resourceFieldRef limits.memory, divisor 1)", EnvVar, raw, int64(math.MaxInt64))
	}
	limit := n / ShareDen * ShareNum // divided first: no overflow
	debug.SetMemoryLimit(limit)
	return Result{Limit: limit, Container: n, Source: EnvVar}, nil
}
