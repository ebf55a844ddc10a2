package leaderelection_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/leaderelection"
)

// leases is a standby's Lease client that counts its Gets and can refuse
// or silence its list and watch.
type leases struct {
	coordinationv1client.LeasesGetter
	gets      atomic.Int64
	writes    atomic.Int64 // Creates and Updates sent, successful or not
	forbidden bool         // list and watch refused, as without RBAC for them
	silent    atomic.Bool  // watch events dropped from now on
	// getsAtWrite is the Get count at the first successful write.
	getsAtWrite atomic.Int64
	wrote       atomic.Bool
	// failUpdate fails the next Update; slowGet delays the next Get;
	// slowList delays every List and Watch (listed is set when one has
	// returned: client-go's informer lists by a watch when the apiserver
	// supports it).
	failUpdate atomic.Bool
	slowGet    atomic.Int64
	slowUpdate atomic.Int64 // delays every Update
	slowList   atomic.Int64
	listed     atomic.Bool
	// watching is the number of watches opened and not yet stopped.
	watching atomic.Int64
	// renewed lists the renewTime of every successful write.
	mu      sync.Mutex
	renewed []time.Time
}

func (l *leases) Leases(ns string) coordinationv1client.LeaseInterface {
	return &leaseClient{LeaseInterface: l.LeasesGetter.Leases(ns), l: l}
}

type leaseClient struct {
	coordinationv1client.LeaseInterface
	l *leases
}

func (c *leaseClient) Get(ctx context.Context, name string, o metav1.GetOptions) (*coordinationv1.Lease, error) {
	c.l.gets.Add(1)
	if d := time.Duration(c.l.slowGet.Swap(0)); d > 0 {
		time.Sleep(d)
	}
	return c.LeaseInterface.Get(ctx, name, o)
}

func (c *leaseClient) Create(ctx context.Context, lease *coordinationv1.Lease, o metav1.CreateOptions) (*coordinationv1.Lease, error) {
	c.l.writes.Add(1)
	out, err := c.LeaseInterface.Create(ctx, lease, o)
	if err == nil {
		c.l.mu.Lock()
		c.l.renewed = append(c.l.renewed, out.Spec.RenewTime.Time)
		c.l.mu.Unlock()
	}
	return out, err
}

func (c *leaseClient) Update(ctx context.Context, lease *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	c.l.writes.Add(1)
	if d := time.Duration(c.l.slowUpdate.Load()); d > 0 {
		time.Sleep(d)
	}
	if c.l.failUpdate.Swap(false) {
		return nil, apierrors.NewServerTimeout(coordinationv1.Resource("leases"), "update", 1)
	}
	out, err := c.LeaseInterface.Update(ctx, lease, o)
	if err == nil && !c.l.wrote.Swap(true) {
		c.l.getsAtWrite.Store(c.l.gets.Load())
	}
	if err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "" {
		c.l.mu.Lock()
		c.l.renewed = append(c.l.renewed, out.Spec.RenewTime.Time)
		c.l.mu.Unlock()
	}
	return out, err
}

func (c *leaseClient) List(ctx context.Context, o metav1.ListOptions) (*coordinationv1.LeaseList, error) {
	if c.l.forbidden {
		return nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), "", nil)
	}
	if d := time.Duration(c.l.slowList.Load()); d > 0 {
		time.Sleep(d)
	}
	defer c.l.listed.Store(true)
	return c.LeaseInterface.List(ctx, o)
}

func (c *leaseClient) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	if c.l.forbidden {
		return nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), "", nil)
	}
	if d := time.Duration(c.l.slowList.Load()); d > 0 {
		time.Sleep(d)
	}
	defer c.l.listed.Store(true)
	w, err := c.LeaseInterface.Watch(ctx, o)
	if err != nil {
		return nil, err
	}
	c.l.watching.Add(1)
	return &countedWatch{Interface: watch.Filter(w, func(e watch.Event) (watch.Event, bool) { return e, !c.l.silent.Load() }), open: &c.l.watching}, nil
}

// countedWatch counts itself closed at its first Stop.
type countedWatch struct {
	watch.Interface
	open *atomic.Int64
	once sync.Once
}

func (w *countedWatch) Stop() {
	w.once.Do(func() { w.open.Add(-1) })
	w.Interface.Stop()
}

// leaderAndStandby starts candidate a, and once it leads, candidate b
// whose Lease traffic goes through api; it returns when b has seen a lead.
func leaderAndStandby(t *testing.T, api *leases) (ns string, a, b *candidate, _ *leases) {
	t.Helper()
	env := kubetest.Get(t)
	ns = env.Namespace(t)
	a = start(t, ns, "pod-a_uid-a")
	kubetest.WaitFor(t, 10*time.Second, "a to lead", func() bool { return leading(a) })
	api.LeasesGetter = env.Client.CoordinationV1()
	b = startWith(t, ns, "pod-b_uid-b", api)
	kubetest.WaitFor(t, 10*time.Second, "b to see a lead", func() bool { return b.e.Holder() == "pod-a_uid-a" })
	return ns, a, b, api
}

// A standby learns of the release from its watch and takes the Lease
// without reading it from the API.
func TestStandbyTakesReleasedLeaseFromWatch(t *testing.T) {
	ns, a, b, api := leaderAndStandby(t, &leases{})
	time.Sleep(3 * retryPeriod) // several renewals by a, seen by b

	gets := api.gets.Load()
	released := time.Now().Truncate(time.Microsecond)
	a.stop()
	kubetest.WaitFor(t, leaseDuration, "b to lead after the release", func() bool { return leading(b) })
	// The record says when b took it, not when b's elector began to wait.
	if acquired := getLease(t, ns).Spec.AcquireTime.Time; acquired.Before(released) {
		t.Errorf("Lease acquireTime %s is before the release at %s", acquired, released)
	}
	if n := api.getsAtWrite.Load() - gets; n != 0 {
		t.Errorf("b read the Lease from the API %d times between the release and taking it; want 0, the watch tells it", n)
	}
}

// Without list and watch permission a standby polls, as client-go does.
func TestStandbyPollsWhenItCannotWatch(t *testing.T) {
	_, a, b, api := leaderAndStandby(t, &leases{forbidden: true})

	a.stop()
	kubetest.WaitFor(t, leaseDuration, "b to lead after the release", func() bool { return leading(b) })
	if api.gets.Load() < 2 {
		t.Errorf("b read the Lease %d times; want polling", api.gets.Load())
	}
}

// A watch that goes quiet while the holder renews must not make the
// standby take a Lease that is still held: its write fails on the Lease's
// resourceVersion and it falls back to polling, which sees the renewals.
func TestStandbyWithStalledWatchDoesNotTakeHeldLease(t *testing.T) {
	_, a, b, api := leaderAndStandby(t, &leases{})
	api.silent.Store(true)

	for end := time.Now().Add(2 * leaseDuration); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if leading(b) || !leading(a) {
			t.Fatalf("a leading=%t, b leading=%t while a renews: want only a", leading(a), leading(b))
		}
	}
	a.stop()
	kubetest.WaitFor(t, leaseDuration, "b to lead after the release, by polling", func() bool { return leading(b) })
}

// A renewal that falls back to client-go's slow path (its optimistic write
// failed) and whose read is slow writes a record stamped before the read,
// possibly equal to the second to the last one: standbys keep counting from
// their earlier sighting. The holder's term must count from the stamp, not
// from the late write.
func TestSlowRenewalDoesNotStretchTheTerm(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	api := &leases{LeasesGetter: env.Client.CoordinationV1()}
	a := startWith(t, ns, "pod-a_uid-a", api)
	kubetest.WaitFor(t, 10*time.Second, "a to lead", func() bool { return leading(a) })
	time.Sleep(2 * retryPeriod) // the holder's own elector renews

	api.slowGet.Store(int64(1500 * time.Millisecond))
	api.failUpdate.Store(true)
	kubetest.WaitFor(t, 5*time.Second, "the slow renewal", func() bool { return api.slowGet.Load() == 0 })
	time.Sleep(2 * retryPeriod)
	a.stop()

	// Each write of a's record gave one term, in order.
	api.mu.Lock()
	defer api.mu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.terms) != len(api.renewed) {
		t.Fatalf("%d terms for %d writes", len(a.terms), len(api.renewed))
	}
	length := leaderelection.TermLength(leaseDuration, renewDeadline)
	for i, tm := range a.terms {
		// The Lease keeps microseconds.
		if limit := api.renewed[i].Add(length + time.Microsecond); tm.Until.After(limit) {
			t.Errorf("write %d: term until %s is %s later than its record's renewTime plus the term length",
				i, tm.Until.Format(time.StampMicro), tm.Until.Sub(limit))
		}
	}
}

// A standby started just before a release waits for its watch to list,
// without reading the Lease from the API (its first poll is due a retry
// period after it starts), and takes the Lease the list shows free: a
// fleet of sidecars starting at once sends its watches and no reads.
func TestStandbyStartedJustBeforeReleaseTakesItFromItsWatchsList(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	a := start(t, ns, "pod-a_uid-a")
	kubetest.WaitFor(t, 10*time.Second, "a to hold the Lease", func() bool { return holding(a) })

	// b's list takes a second, so the release falls before its watch's
	// first list.
	const slowRetry = 10 * time.Second
	api := &leases{LeasesGetter: env.Client.CoordinationV1()}
	api.slowList.Store(int64(time.Second))
	cfg := config(env.Client, ns, "pod-b_uid-b")
	cfg.Leases = api
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 3*slowRetry, 2*slowRetry, slowRetry
	b := startConfig(t, cfg)

	a.stop()
	if !a.e.Released() {
		t.Fatalf("a did not release: %v", a.e.ReleaseErr())
	}
	if api.listed.Load() {
		t.Fatal("b's watch listed before the release: the test did not put the release before it")
	}
	// Its first poll is a retry period (10 s, jittered up to 22 s) away.
	kubetest.WaitFor(t, slowRetry/2, "b to take the released Lease before its first poll", func() bool { return leading(b) })
	if n := api.getsAtWrite.Load(); n != 0 {
		t.Errorf("b read the Lease from the API %d times before taking it; want 0, its watch's list tells it", n)
	}
}

// A handover sends what it must and no more: the holder's release is one
// write (client-go's read before it is answered from the holder's last
// renewal), and the standby, once its watch shows the Lease free, sends
// its acquiring write and nothing else until its first renewal a retry
// period later (client-go's holder elector would read the Lease and write
// it twice more at once).
func TestHandoverSendsOnlyTheReleaseAndTheAcquiringWrite(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	apiA := &leases{LeasesGetter: env.Client.CoordinationV1()}
	a := startWith(t, ns, "pod-a_uid-a", apiA)
	kubetest.WaitFor(t, 10*time.Second, "a to hold the Lease", func() bool { return holding(a) })
	apiB := &leases{LeasesGetter: env.Client.CoordinationV1()}
	b := startWith(t, ns, "pod-b_uid-b", apiB)
	kubetest.WaitFor(t, 10*time.Second, "b to see a lead", func() bool { return b.e.Holder() == "pod-a_uid-a" })
	kubetest.WaitFor(t, 10*time.Second, "b's watch to list", func() bool { return apiB.listed.Load() })

	// a's renewals are writes only; count from one that has just ended.
	renewals := len(a.termsCopy())
	kubetest.WaitFor(t, 5*time.Second, "a renewal", func() bool { return len(a.termsCopy()) > renewals })
	aGets, aWrites := apiA.gets.Load(), apiA.writes.Load()
	bGets, bWrites := apiB.gets.Load(), apiB.writes.Load() // b may take the Lease before a's Run returns
	a.stop()
	if !a.e.Released() {
		t.Fatalf("a did not release: %v", a.e.ReleaseErr())
	}
	if gets, writes := apiA.gets.Load()-aGets, apiA.writes.Load()-aWrites; gets != 0 || writes != 1 {
		t.Errorf("a's release sent %d reads and %d writes; want 0 and 1", gets, writes)
	}

	kubetest.WaitFor(t, leaseDuration, "b to lead", func() bool { return leading(b) })
	first := b.termsCopy()[0]
	kubetest.WaitFor(t, 5*time.Second, "b's first renewal", func() bool { return len(b.termsCopy()) >= 2 })
	if gets := apiB.gets.Load() - bGets; gets != 0 {
		t.Errorf("b read the Lease from the API %d times between the release and its first renewal; want 0", gets)
	}
	if writes := apiB.writes.Load() - bWrites; writes != 2 {
		t.Errorf("b sent %d writes between the release and its first renewal; want 2, the acquiring write and the renewal", writes)
	}
	apiB.mu.Lock()
	renewed := append([]time.Time(nil), apiB.renewed...)
	apiB.mu.Unlock()
	if len(renewed) < 2 || renewed[1].Sub(renewed[0]) < retryPeriod/2 {
		t.Errorf("b's records were stamped %v: want its renewal at least half a retry period (%s) after its acquiring write", renewed, retryPeriod/2)
	}
	// The term of the acquisition counts from the acquiring write alone.
	if limit := renewed[0].Add(leaderelection.TermLength(leaseDuration, renewDeadline) + time.Microsecond); first.Until.After(limit) {
		t.Errorf("b's first term ends %s, after its acquiring record's renewTime plus the term length (%s)", first.Until, limit)
	}
	// Still the holder's elector: a cancel releases.
	b.stop()
	if !b.e.Released() {
		t.Errorf("b did not release: %v", b.e.ReleaseErr())
	}
}

// A holder keeps no watch of its Lease open (it reads nothing from it, and
// the apiserver would send it every renewal); it opens one again to stand
// by after losing the Lease.
func TestHolderKeepsNoWatchOpen(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	api := &leases{LeasesGetter: env.Client.CoordinationV1()}
	a := startWith(t, ns, "pod-a_uid-a", api)
	kubetest.WaitFor(t, 10*time.Second, "a to hold the Lease", func() bool { return holding(a) })
	kubetest.WaitFor(t, 5*time.Second, "a's watch to be stopped", func() bool { return api.watching.Load() == 0 })

	takeLease(t, ns, "pod-x_uid-x") // a's renewals fail: it stands by again
	kubetest.WaitFor(t, 3*renewDeadline, "a to watch the Lease again after losing it", func() bool { return !leading(a) && api.watching.Load() == 1 })
	a.stop()
	if n := api.watching.Load(); n != 0 {
		t.Errorf("%d watches still open after Run returned", n)
	}
}
