package sidecar

import (
	"strconv"
	"time"

	"k8s.io/client-go/rest"

	"github.com/handoff-dev/handoff/leaderelection"
)

// leaseConfig is the REST configuration of the Lease client: its own rate
// budget, sized for the sidecar's Leases (leaderelection.ClientBudget), so
// that other API use can never delay a renewal and the renewals of many
// Leases do not queue past their renew deadline. It has no
// rest.Config.Timeout: that would also cut the standby's watch of its Lease
// every timeout; the elector bounds each Lease read and write instead
// (leaderelection.RequestTimeout).
func leaseConfig(rc *rest.Config, b leaderelection.Budget) *rest.Config {
	lrc := rest.CopyConfig(rc)
	lrc.QPS, lrc.Burst = b.QPS, b.Burst
	return lrc
}

// setHTTP2HealthCheck sets client-go's HTTP/2 health check (the
// HTTP2_READ_IDLE_TIMEOUT_SECONDS and HTTP2_PING_TIMEOUT_SECONDS variables,
// read when a transport is built, whole seconds; defaults 30 s and 15 s)
// from the renew deadline (http2HealthCheck), each unless already set. A
// request timeout alone does not save the Lease from a connection that is
// open but dead: the retry goes out on the same connection. The health
// check closes it inside the renew deadline, and the next renewal dials
// anew.
func setHTTP2HealthCheck(lookup func(string) (string, bool), set func(string, string) error, renewDeadline time.Duration) {
	idle, ping := http2HealthCheck(renewDeadline)
	for name, d := range map[string]time.Duration{"HTTP2_READ_IDLE_TIMEOUT_SECONDS": idle, "HTTP2_PING_TIMEOUT_SECONDS": ping} {
		if _, ok := lookup(name); !ok {
			_ = set(name, strconv.Itoa(int(d/time.Second))) // a valid name and value cannot fail
		}
	}
}

// http2HealthCheck is the read-idle and the ping timeout of the HTTP/2
// health check, in whole seconds, at least 1 s each: a fifth and a half of
// the renew deadline (2 s and 5 s at the default 10 s), so a dead
// connection is closed within seven tenths of it, with a retry period left
// for a renewal on a new one. The ping timeout is the longer: an apiserver
// busy on a loaded node answers a ping late, and a ping timeout of 2 s was
// seen to drop live connections by the hundred, each taking the sidecar's
// watches with it (docs/performance.md, scale).
func http2HealthCheck(renewDeadline time.Duration) (readIdle, ping time.Duration) {
	return max(time.Second, (renewDeadline / 5).Truncate(time.Second)), max(time.Second, (renewDeadline / 2).Truncate(time.Second))
}
