package leaderelection_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/internal/faultproxy"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/leaderelection"
)

// proxied starts a fault proxy in front of the apiserver and returns it
// with a client whose every request goes through it.
func proxied(t *testing.T) (*faultproxy.Proxy, kubernetes.Interface) {
	t.Helper()
	p, cfg := faultproxy.ForConfig(t, kubetest.Get(t).Config)
	return p, kubernetes.NewForConfigOrDie(cfg)
}

// holderAndStandby starts a, whose Lease traffic goes through leases, and
// once it leads, b on the apiserver directly; it returns when b has seen a
// lead.
func holderAndStandby(t *testing.T, ns string, leases kubernetes.Interface) (a, b *candidate) {
	t.Helper()
	a = startWith(t, ns, "pod-a_uid-a", leases.CoordinationV1())
	kubetest.WaitFor(t, 10*time.Second, "a to hold the Lease", func() bool { return holding(a) })
	b = start(t, ns, "pod-b_uid-b")
	kubetest.WaitFor(t, 10*time.Second, "b to see a lead", func() bool { return b.e.Holder() == "pod-a_uid-a" })
	return a, b
}

// span is one term as the app saw it: from its OnTerm to its Until, or
// to the cancel of its Run if that came first (the term ends before the
// release is written, and no one else acquires before that write).
type span struct{ from, until time.Time }

func (c *candidate) spans() []span {
	released := c.e.Released()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]span, len(c.terms))
	for i, tm := range c.terms {
		out[i] = span{c.termAt[i], tm.Until}
		if !c.stopAt.IsZero() && c.stopAt.After(c.termAt[i]) && c.stopAt.Before(tm.Until) {
			out[i].until = c.stopAt
		}
		// A renewal that lands after stop was called (it was under way)
		// begins a term that the written release ends: the term is over
		// before the release is written, and so before Run returns.
		if released && !c.endAt.IsZero() && !c.termAt[i].Before(c.stopAt) && c.endAt.Before(out[i].until) {
			out[i].until = c.endAt
		}
	}
	return out
}

// firstTermAt is when c's first OnTerm came; zero if none.
func (c *candidate) firstTermAt() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.termAt) == 0 {
		return time.Time{}
	}
	return c.termAt[0]
}

// lastUntil is the Until of c's last term before t.
func (c *candidate) lastUntilBefore(t time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var until time.Time
	for i, tm := range c.terms {
		if c.termAt[i].Before(t) {
			until = tm.Until
		}
	}
	return until
}

// noOverlap fails the test if any term of a and any term of b were both
// running at one instant on the test's clock.
func noOverlap(t *testing.T, a, b *candidate) {
	t.Helper()
	for _, x := range a.spans() {
		for _, y := range b.spans() {
			if x.from.Before(y.until) && y.from.Before(x.until) {
				t.Errorf("terms overlap: a's from %s until %s, b's from %s until %s",
					x.from.Format(time.StampMicro), x.until.Format(time.StampMicro), y.from.Format(time.StampMicro), y.until.Format(time.StampMicro))
			}
		}
	}
}

// The apiserver unreachable during the release: the release is not
// written, ReleaseErr says why, Run returns within client-go's release
// bound (one renew deadline), and a standby takes the Lease once its lease
// duration has run out.
func TestFaultAPIServerUnreachableDuringRelease(t *testing.T) {
	ns := kubetest.Get(t).Namespace(t)
	p, client := proxied(t)
	a, b := holderAndStandby(t, ns, client)

	p.Cut()
	stopped := make(chan struct{})
	go func() { a.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(2*renewDeadline + 5*time.Second):
		t.Fatalf("Run did not return %s after its cancel with the apiserver unreachable", 2*renewDeadline+5*time.Second)
	}
	if a.e.Released() {
		t.Fatal("released with the apiserver unreachable")
	}
	err := a.e.ReleaseErr()
	if err == nil || !strings.Contains(err.Error(), "not released") {
		t.Fatalf("ReleaseErr = %v, want why the release was not written", err)
	}
	t.Logf("ReleaseErr: %v", err)
	if leading(a) {
		t.Error("a still has a term after Run returned")
	}
	l := getLease(t, ns)
	if got := *l.Spec.HolderIdentity; got != "pod-a_uid-a" {
		t.Fatalf("Lease holder = %q, want pod-a_uid-a until its lease duration runs out", got)
	}
	lastRenew := l.Spec.RenewTime.Time
	took := kubetest.WaitFor(t, leaseDuration+renewDeadline+5*time.Second, "b to take the expired Lease", func() bool { return leading(b) })
	if earliest := lastRenew.Truncate(time.Second).Add(leaseDuration); took.Before(earliest) {
		t.Errorf("b took the Lease %s after its last renewal, before the lease duration %s ran out", took.Sub(lastRenew), leaseDuration)
	}
	noOverlap(t, a, b)
}

// The apiserver unreachable for the holder from before its term ends, for
// good: its term ends on its own clock before any other candidate acquires,
// and no two terms overlap.
func TestFaultAPIServerUnreachableHolderTermEndsFirst(t *testing.T) {
	ns := kubetest.Get(t).Namespace(t)
	p, client := proxied(t)
	a, b := holderAndStandby(t, ns, client)

	p.Cut()
	kubetest.WaitFor(t, leaseDuration+renewDeadline+5*time.Second, "b to take the Lease of the cut-off holder", func() bool { return leading(b) })
	acquired := b.firstTermAt()
	if _, ok := a.e.Term(); ok {
		t.Error("a, cut off, still has a term when b has acquired")
	}
	until := a.lastUntilBefore(acquired)
	if !until.Before(acquired) {
		t.Errorf("a's last term ran until %s, not before b acquired at %s", until.Format(time.StampMicro), acquired.Format(time.StampMicro))
	}
	t.Logf("a's term ended %s before b acquired", acquired.Sub(until))

	// Back in touch, a finds b holding and competes as a standby.
	if err := p.Restore(); err != nil {
		t.Fatal(err)
	}
	kubetest.WaitFor(t, 10*time.Second, "a to see b hold the Lease", func() bool { return a.e.Holder() == "pod-b_uid-b" })
	for end := time.Now().Add(leaseDuration); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if leading(a) {
			t.Fatal("a leads again while b renews")
		}
	}
	noOverlap(t, a, b)
}

// leaseWriteErrors answers the Lease writes (PUT) of its client with 429
// and 503 while on. toxiproxy works at TCP level and cannot answer HTTP
// status codes, so this fault is a RoundTripper on the client
// (rest.Config.WrapTransport): the requests never reach the apiserver, as
// when its priority and fairness rejects them (429, with Retry-After) or
// a proxy in front of it fails (503).
type leaseWriteErrors struct {
	next http.RoundTripper
	on   *atomic.Bool
	n    *atomic.Int64 // answered so far
}

func (rt leaseWriteErrors) RoundTrip(req *http.Request) (*http.Response, error) {
	if !rt.on.Load() || req.Method != http.MethodPut || !strings.Contains(req.URL.Path, "/leases/") {
		return rt.next.RoundTrip(req)
	}
	if req.Body != nil {
		_ = req.Body.Close()
	}
	code, header := http.StatusServiceUnavailable, http.Header{"Content-Type": {"text/plain"}}
	if rt.n.Add(1)%2 == 1 {
		code = http.StatusTooManyRequests
		header.Set("Retry-After", "1")
	}
	return &http.Response{StatusCode: code, Status: http.StatusText(code), Header: header, Request: req,
		Body: io.NopCloser(strings.NewReader(http.StatusText(code))), ContentLength: int64(len(http.StatusText(code)))}, nil
}

// Lease writes answered 429 or 503 for longer than the renew deadline:
// the holder's term ends before another candidate acquires, no two terms
// overlap, and after the window the first holder can lead again.
func TestFaultLeaseWritesAnswered429Or503(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	var on atomic.Bool
	var answered atomic.Int64
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return leaseWriteErrors{next: rt, on: &on, n: &answered}
	}
	a, b := holderAndStandby(t, ns, kubernetes.NewForConfigOrDie(cfg))

	on.Store(true)
	kubetest.WaitFor(t, leaseDuration+renewDeadline+5*time.Second, "b to take the Lease a cannot renew", func() bool { return leading(b) })
	acquired := b.firstTermAt()
	if until := a.lastUntilBefore(acquired); !until.Before(acquired) {
		t.Errorf("a's last term ran until %s, not before b acquired at %s", until.Format(time.StampMicro), acquired.Format(time.StampMicro))
	}
	if answered.Load() == 0 {
		t.Fatal("no Lease write was answered with an error: the fault did not happen")
	}
	t.Logf("%d Lease writes answered 429 or 503", answered.Load())
	on.Store(false)

	// After the window a competes normally: it takes the Lease when b
	// releases it.
	kubetest.WaitFor(t, 10*time.Second, "b to hold the Lease", func() bool { return holding(b) })
	b.stop()
	if !b.e.Released() {
		t.Fatalf("b did not release: %v", b.e.ReleaseErr())
	}
	kubetest.WaitFor(t, leaseDuration, "a to lead again after the window", func() bool { return leading(a) })
	noOverlap(t, a, b)
}

// A slow apiserver for everything but the Leases (each response through
// the proxy delayed by seconds) does not touch renewals and takeover when
// the Leases have their own client, as the sidecar's do
// (internal/cli/sidecar/client.go).
func TestFaultSlowNonLeaseRequestsLeaveRenewalsAlone(t *testing.T) {
	const latency = leaseDuration // more than the renew deadline
	ns := kubetest.Get(t).Namespace(t)
	p, slow := proxied(t)
	if err := p.Latency(latency); err != nil {
		t.Fatal(err)
	}
	a := start(t, ns, "pod-a_uid-a")
	kubetest.WaitFor(t, 10*time.Second, "a to hold the Lease", func() bool { return holding(a) })

	// Meanwhile the other client reads through the slow proxy, over and over.
	ctx, cancel := context.WithCancel(context.Background())
	var slowDone atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			_, _ = slow.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			slowDone.Add(1)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	a.mu.Lock()
	before := len(a.terms)
	a.mu.Unlock()
	for end := time.Now().Add(leaseDuration); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if !leading(a) {
			t.Fatal("a lost its term while another client was slow")
		}
	}
	a.mu.Lock()
	renewals := len(a.terms) - before
	a.mu.Unlock()
	// Each slow read takes the latency, a lease duration's worth: at most
	// one has come back, while the Lease client renewed every retry period.
	if n := slowDone.Load(); n > 1 {
		t.Fatalf("the slow client finished %d reads in %s: the fault did not happen", n, leaseDuration)
	}
	if renewals < 2 {
		t.Errorf("%d renewals in a lease duration while another client was stalled, want several", renewals)
	}
	t.Logf("%d renewals while the other client finished %d reads", renewals, slowDone.Load())

	b := start(t, ns, "pod-b_uid-b")
	kubetest.WaitFor(t, 10*time.Second, "b to see a lead", func() bool { return b.e.Holder() == "pod-a_uid-a" })
	a.stop()
	kubetest.WaitFor(t, leaseDuration, "b to take the released Lease", func() bool { return leading(b) })
	noOverlap(t, a, b)
}

// A request that hangs on a connection that stays open, silently dead
// (the proxy drops every byte to the apiserver and never closes it), while
// new connections work. The client's connections go through the proxy
// until the fault, later ones straight to the apiserver: toxiproxy's
// toxics apply to new connections too, and removing its timeout toxic
// closes the hung ones, so only this keeps the old connections hung for
// good. The elector's request timeout (RequestTimeout,
// max(1s, renewDeadline/2)) cancels the hung renewal, but the HTTP/2 transport
// sends the next one on the same dead connection: the Lease is kept only
// when the transport's health check (a ping after a read-idle time, then
// a ping timeout; client-go reads them from HTTP2_READ_IDLE_TIMEOUT_SECONDS
// and HTTP2_PING_TIMEOUT_SECONDS, 30 s and 15 s by default) closes it
// within the renew deadline.
func TestFaultHungConnection(t *testing.T) {
	const (
		leaseDuration = 6 * time.Second
		renewDeadline = 4 * time.Second
		retryPeriod   = 500 * time.Millisecond
	)
	// The elector bounds each Lease request (RequestTimeout); the client has
	// no timeout of its own, as in the sidecar command.
	for _, tc := range []struct {
		name        string
		healthCheck bool // 1 s read-idle and 1 s ping timeout
		keepsTerm   bool
	}{
		{"request timeout and health check: the Lease is kept", true, true},
		{"request timeout alone: the term is lost", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.healthCheck {
				t.Setenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", "1")
				t.Setenv("HTTP2_PING_TIMEOUT_SECONDS", "1")
			}
			env := kubetest.Get(t)
			ns := env.Namespace(t)
			p, cfg := faultproxy.ForConfig(t, env.Config)
			direct, err := url.Parse(env.Config.Host)
			if err != nil {
				t.Fatal(err)
			}
			var dials atomic.Int64
			var hung atomic.Bool
			var dialer net.Dialer
			// A Dial func also keeps client-go from sharing a cached
			// transport with the other tests.
			cfg.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
				if dials.Add(1); !hung.Load() {
					return dialer.DialContext(ctx, network, p.Addr())
				}
				return dialer.DialContext(ctx, network, direct.Host)
			}
			timings := func(c leaderelection.Config) leaderelection.Config {
				c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = leaseDuration, renewDeadline, retryPeriod
				return c
			}
			a := startConfig(t, timings(config(kubernetes.NewForConfigOrDie(cfg), ns, "pod-a_uid-a")))
			kubetest.WaitFor(t, 10*time.Second, "a to hold the Lease", func() bool { return holding(a) })
			b := startConfig(t, timings(config(env.Client, ns, "pod-b_uid-b")))
			kubetest.WaitFor(t, 10*time.Second, "b to see a lead", func() bool { return b.e.Holder() == "pod-a_uid-a" })

			before := dials.Load()
			hung.Store(true)
			if err := p.Hang(); err != nil {
				t.Fatal(err)
			}
			lost := false
			for end := time.Now().Add(leaseDuration + renewDeadline); time.Now().Before(end) && !lost; time.Sleep(10 * time.Millisecond) {
				lost = !leading(a)
			}
			t.Logf("connections: %d through the proxy, then %d", before, dials.Load()-before)
			if lost == tc.keepsTerm {
				t.Fatalf("a's term lost: %t; want %t", lost, !tc.keepsTerm)
			}
			if tc.keepsTerm && leading(b) {
				t.Fatal("b leads while a keeps its term")
			}
			noOverlap(t, a, b)
		})
	}
}

// Connections reset (TCP RST on the next data, new connections too) for
// less than the renew deadline: the failed renewals are retried every
// retry period, one gets through once the resets stop, and the Lease is
// kept.
func TestFaultConnectionsResetBriefly(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	p, client := proxied(t)
	failed := &failedWrites{LeasesGetter: client.CoordinationV1()}
	a := startWith(t, ns, "pod-a_uid-a", failed)
	kubetest.WaitFor(t, 10*time.Second, "a to hold the Lease", func() bool { return holding(a) })
	b := start(t, ns, "pod-b_uid-b")
	kubetest.WaitFor(t, 10*time.Second, "b to see a lead", func() bool { return b.e.Holder() == "pod-a_uid-a" })
	a.mu.Lock()
	before := len(a.terms)
	a.mu.Unlock()

	if err := p.Reset(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(renewDeadline / 4)
	if err := p.Restore(); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(leaseDuration); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if !leading(a) || leading(b) {
			t.Fatalf("a leading %t, b leading %t after brief resets: want a to keep the Lease", leading(a), leading(b))
		}
	}
	a.mu.Lock()
	renewed := len(a.terms) - before
	a.mu.Unlock()
	if renewed == 0 {
		t.Fatal("a did not renew after the resets")
	}
	if failed.n.Load() == 0 {
		t.Fatal("no renewal failed: the resets did not happen")
	}
	t.Logf("%d renewals failed, %d succeeded", failed.n.Load(), renewed)
	noOverlap(t, a, b)
}

// failedWrites counts the Lease writes of its client that failed.
type failedWrites struct {
	coordinationv1client.LeasesGetter
	n atomic.Int64
}

func (f *failedWrites) Leases(ns string) coordinationv1client.LeaseInterface {
	return &failedWritesClient{LeaseInterface: f.LeasesGetter.Leases(ns), f: f}
}

type failedWritesClient struct {
	coordinationv1client.LeaseInterface
	f *failedWrites
}

func (c *failedWritesClient) Update(ctx context.Context, l *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	out, err := c.LeaseInterface.Update(ctx, l, o)
	if err != nil {
		c.f.n.Add(1)
	}
	return out, err
}

// answerLate sends the first Lease write of its client to the apiserver
// (which commits it), signals written, and holds the answer until answer
// is closed: then it returns it, or, if the request's context has ended
// meanwhile, the context's error, as a client whose request was cut after
// it was sent.
type answerLate struct {
	next            http.RoundTripper
	once            *atomic.Bool
	written, answer chan struct{}
}

func (rt answerLate) RoundTrip(req *http.Request) (*http.Response, error) {
	if (req.Method != http.MethodPut && req.Method != http.MethodPost) || !strings.Contains(req.URL.Path, "/leases") || !rt.once.CompareAndSwap(false, true) {
		return rt.next.RoundTrip(req)
	}
	resp, err := rt.next.RoundTrip(req.WithContext(context.WithoutCancel(req.Context())))
	close(rt.written)
	<-rt.answer
	if req.Context().Err() != nil {
		if resp != nil {
			_ = resp.Body.Close()
		}
		return nil, req.Context().Err()
	}
	return resp, err
}

// A standby stopped while its acquiring write is in flight: the write
// lands, so the Lease names the standby; the elector waits for its answer
// (within the request timeout) rather than abandoning it, so it knows it
// holds the Lease and releases it before Run returns. Abandoned, the Lease
// would name a candidate that no longer runs, unrenewed, until it expired.
func TestStandbyStoppedDuringItsAcquiringWrite(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	rt := answerLate{once: &atomic.Bool{}, written: make(chan struct{}), answer: make(chan struct{})}
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(next http.RoundTripper) http.RoundTripper { rt.next = next; return rt }
	b := startWith(t, ns, "pod-b_uid-b", kubernetes.NewForConfigOrDie(cfg).CoordinationV1())
	select {
	case <-rt.written:
	case <-time.After(10 * time.Second):
		t.Fatal("no acquiring write within 10s")
	}
	if h := ptr.Deref(getLease(t, ns).Spec.HolderIdentity, ""); h != "pod-b_uid-b" {
		t.Fatalf("after the acquiring write the Lease names %q, want pod-b_uid-b", h)
	}
	b.cancel()
	close(rt.answer)
	select {
	case <-b.done:
	case <-time.After(2 * renewDeadline):
		t.Fatalf("Run did not return within %s of its context's end", 2*renewDeadline)
	}
	if h := ptr.Deref(getLease(t, ns).Spec.HolderIdentity, ""); h != "" || !b.e.Released() {
		t.Fatalf("after Run returned the Lease names %q (want none), released %t (%v)", h, b.e.Released(), b.e.ReleaseErr())
	}
}
