package main

import (
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/handoff-dev/handoff/config"
)

// The Lease client bounds each request as client-go's own constructor
// (resourcelock.NewFromKubeconfig) does: max(1s, renew deadline / 2).
func TestLeaseClientHasARequestTimeout(t *testing.T) {
	for _, tc := range []struct {
		renewDeadline, want time.Duration
	}{
		{10 * time.Second, 5 * time.Second},
		{1500 * time.Millisecond, time.Second},
	} {
		s := &config.Settings{RenewDeadline: tc.renewDeadline}
		rc := &rest.Config{Host: "https://example.invalid"}
		got := leaseConfig(rc, s)
		if got.Timeout != tc.want {
			t.Errorf("renew deadline %s: Lease client timeout %s, want %s", tc.renewDeadline, got.Timeout, tc.want)
		}
		if got.QPS != leaseQPS || got.Burst != leaseBurst || rc.Timeout != 0 {
			t.Errorf("QPS %v burst %d, shared config timeout %s: want %d, %d and the shared config untouched", got.QPS, got.Burst, rc.Timeout, leaseQPS, leaseBurst)
		}
	}
}
