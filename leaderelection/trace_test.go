package leaderelection_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/leaderelection"
)

// hops records the hops a candidate traced, in order.
type hops struct {
	mu  sync.Mutex
	got []leaderelection.Hop
}

func (h *hops) trace(p leaderelection.Hop) {
	h.mu.Lock()
	h.got = append(h.got, p)
	h.mu.Unlock()
}

func (h *hops) list() []leaderelection.Hop {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.got)
}

// A handover is traced hop by hop: the holder's release write sent and
// acknowledged, the standby's watch seeing the Lease free, its elector
// handed it, its acquiring write sent and acknowledged, in that order.
func TestTraceFollowsAHandover(t *testing.T) {
	ns := kubetest.Get(t).Namespace(t)
	var ha, hb hops
	cfg := config(kubetest.Get(t).Client, ns, "pod-a_uid-a")
	cfg.Trace = ha.trace
	a := startConfig(t, cfg)
	kubetest.WaitFor(t, 10*time.Second, "a to hold the Lease", func() bool { return holding(a) })
	// a acquired the Lease it found missing (free, no event): its standby
	// phase traced that answer and the acquiring write, and nothing else.
	if got, want := ha.list(), []leaderelection.Hop{leaderelection.HopFreeAnswered, leaderelection.HopAcquireSent, leaderelection.HopAcquireAcked}; !slices.Equal(got, want) {
		t.Fatalf("a's hops before the handover = %v, want %v", got, want)
	}
	cfg = config(kubetest.Get(t).Client, ns, "pod-b_uid-b")
	cfg.Trace = hb.trace
	b := startConfig(t, cfg)
	kubetest.WaitFor(t, 10*time.Second, "b's watch to list", func() bool { return a.e.Holder() == "pod-a_uid-a" && b.e.Holder() == "pod-a_uid-a" })
	a.stop()
	kubetest.WaitFor(t, leaseDuration, "b to lead", func() bool { return leading(b) })

	if got, want := ha.list()[3:], []leaderelection.Hop{leaderelection.HopReleaseSent, leaderelection.HopReleaseAcked}; !slices.Equal(got, want) {
		t.Errorf("a's hops at its release = %v, want %v", got, want)
	}
	got := hb.list()
	want := []leaderelection.Hop{leaderelection.HopFreeSeen, leaderelection.HopFreeAnswered, leaderelection.HopAcquireSent, leaderelection.HopAcquireAcked}
	if !slices.Equal(got, want) {
		t.Errorf("b's hops = %v, want %v", got, want)
	}
}
