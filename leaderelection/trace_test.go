package leaderelection_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"

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

// renewals signals each successful write of a holder's record after the
// first (its renewals).
type renewals struct {
	coordinationv1client.LeasesGetter
	writes  atomic.Int64
	renewed chan struct{}
}

func (r *renewals) Leases(ns string) coordinationv1client.LeaseInterface {
	return renewalsClient{LeaseInterface: r.LeasesGetter.Leases(ns), r: r}
}

type renewalsClient struct {
	coordinationv1client.LeaseInterface
	r *renewals
}

func (c renewalsClient) Update(ctx context.Context, l *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	out, err := c.LeaseInterface.Update(ctx, l, o)
	if err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && c.r.writes.Add(1) > 1 {
		select {
		case c.r.renewed <- struct{}{}:
		default:
		}
	}
	return out, err
}

// A release that comes right after a renewal, while the standby's elector
// has just been handed that renewal and waits its short retry period
// before asking again, is taken from the watch all the same: no read, and
// the hops of a takeover in order.
func TestStandbyTakesAReleaseRightAfterARenewal(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	ra := &renewals{LeasesGetter: env.Client.CoordinationV1(), renewed: make(chan struct{}, 1)}
	a := startWith(t, ns, "pod-a_uid-a", ra)
	kubetest.WaitFor(t, 10*time.Second, "a to hold the Lease", func() bool { return holding(a) })
	api := &leases{LeasesGetter: env.Client.CoordinationV1()}
	var hb hops
	cfg := config(env.Client, ns, "pod-b_uid-b")
	cfg.Leases, cfg.Trace = api, hb.trace
	b := startConfig(t, cfg)
	kubetest.WaitFor(t, 10*time.Second, "b's watch to list", func() bool { return b.e.Holder() == "pod-a_uid-a" })
	select { // a renewal b's watch may have seen already
	case <-ra.renewed:
	default:
	}
	select {
	case <-ra.renewed:
	case <-time.After(leaseDuration):
		t.Fatal("a did not renew")
	}
	a.stop()
	kubetest.WaitFor(t, leaseDuration, "b to lead", func() bool { return leading(b) })
	if n := api.gets.Load(); n != 0 {
		t.Errorf("b read the Lease %d times; want 0 (taken from its watch)", n)
	}
	want := []leaderelection.Hop{leaderelection.HopFreeSeen, leaderelection.HopFreeAnswered, leaderelection.HopAcquireSent, leaderelection.HopAcquireAcked}
	if got := hb.list(); !slices.Equal(got, want) {
		t.Errorf("b's hops = %v, want %v", got, want)
	}
}
