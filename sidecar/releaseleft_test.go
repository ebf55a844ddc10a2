package sidecar_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"bytes"
	"encoding/json"
	"io"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/handoff-dev/handoff/internal/faultproxy"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/sidecar"
	"github.com/handoff-dev/handoff/worker"
)

// holdAnswer sends the first Lease write after armed to the apiserver
// (which commits it), closes written, and holds the answer until answer is
// closed or the request's context ends. Then it returns the answer, or with
// lose an error, as a client whose answer was lost on the way.
type holdAnswer struct {
	next            http.RoundTripper
	armed, sent     atomic.Bool
	lose            bool
	written, answer chan struct{}
}

func (h *holdAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	if !h.armed.Load() || (req.Method != http.MethodPut && req.Method != http.MethodPost) || !strings.Contains(req.URL.Path, "/leases") || !h.sent.CompareAndSwap(false, true) {
		return h.next.RoundTrip(req)
	}
	resp, err := h.next.RoundTrip(req.WithContext(context.WithoutCancel(req.Context())))
	close(h.written)
	select {
	case <-h.answer:
	case <-req.Context().Done():
	}
	if h.lose || req.Context().Err() != nil {
		if resp != nil {
			_ = resp.Body.Close()
		}
		if h.lose {
			return nil, errors.New("answer lost by the test")
		}
		return nil, req.Context().Err()
	}
	return resp, err
}

// standbyWinsDuringItsStop has pod-a lead the Lease, and pod-b stand by
// with a client whose next Lease write is held (holdAnswer). pod-a's
// preStop frees the Lease; pod-b's acquiring write lands, and while its
// answer is held pod-b's preStop starts; then the answer is let through
// (or lost). It returns pod-b's report, and when pod-b's sequence started.
func standbyWinsDuringItsStop(t *testing.T, lose bool) (*protocol.Report, time.Time) {
	t.Helper()
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	a := newPod(t, ns, "pod-a", nil, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)
	h := &holdAnswer{lose: lose, written: make(chan struct{}), answer: make(chan struct{})}
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(func(next http.RoundTripper) http.RoundTripper { h.next = next; return h })
	var leases coordinationv1client.LeasesGetter = kubernetes.NewForConfigOrDie(cfg).CoordinationV1()
	b := startPod(t, env.Pod(t, ns, "pod-b", 30), nil, worker.Options{}, leases)
	kubetest.WaitFor(t, 10*time.Second, "pod-b to see pod-a hold the Lease", func() bool {
		st := b.c.Status()
		return len(st.Leases) == 1 && strings.HasPrefix(st.Leases[0].HolderIdentity, "pod-a_")
	})
	h.armed.Store(true)
	if _, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.written:
	case <-time.After(10 * time.Second):
		t.Fatal("pod-b sent no acquiring write within 10s of pod-a's release")
	}
	if got := holder(t, ns); !strings.HasPrefix(got, "pod-b_") {
		t.Fatalf("after pod-b's acquiring write the Lease names %q, want pod-b", got)
	}
	reports := make(chan *protocol.Report, 1)
	started := time.Now()
	go func() {
		rep, err := b.c.Shutdown(context.Background(), prestop.TriggerPreStop)
		if err != nil {
			t.Error(err)
		}
		reports <- rep
	}()
	kubetest.WaitFor(t, time.Second, "pod-b's sequence to start", func() bool { return b.c.Status().Phase != sidecar.PhaseRunning })
	close(h.answer)
	rep := <-reports
	if rep == nil {
		t.FailNow()
	}
	t.Logf("pod-b's report: outcome %s, leases %+v, errors %q", rep.Outcome, rep.Leases, rep.Errors)
	if got := holder(t, ns); got != "" {
		t.Errorf("after pod-b's sequence the Lease names %q, want none", got)
	}
	if len(rep.Leases) != 1 || !rep.Leases[0].WasLeader || !rep.Leases[0].Released || len(rep.Errors) > 0 {
		t.Errorf("pod-b's report: leases %+v, errors %q; want the Lease led and released, no error", rep.Leases, rep.Errors)
	}
	if n := b.calls.grantsSince(started); n > 0 {
		t.Errorf("%d grants reached pod-b's stopping app", n)
	}
	if ev := events(t, ns, "pod-b", sidecar.ReasonLeaseReleased); len(ev) != 1 {
		t.Errorf("pod-b's LeaseReleased Events: %q, want one", ev)
	}
	return rep, started
}

// holder is the Lease's holder identity, "" when free.
func holder(t *testing.T, ns string) string {
	t.Helper()
	l, err := kubetest.Get(t).Client.CoordinationV1().Leases(ns).Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ptr.Deref(l.Spec.HolderIdentity, "")
}

// A standby's acquiring write answered only after the pod's sequence has
// started: its elector leads, only to release at once, and the report says
// the Lease was led and released, with its LeaseReleased Event; the
// stopping app is never told it leads.
func TestLeaseWonByAWriteAnsweredAfterTheStopIsReleased(t *testing.T) {
	standbyWinsDuringItsStop(t, false)
}

// A standby's acquiring write lands, but its answer is lost, and the pod's
// sequence starts: the elector never learns it holds the Lease, which
// names the pod, unrenewed, until it expires. The sequence reads the Lease
// it did not release and frees it.
func TestLeaseWonByAWriteWhoseAnswerIsLostIsFreed(t *testing.T) {
	rep, _ := standbyWinsDuringItsStop(t, true)
	if len(rep.Leases) == 1 && !strings.Contains(rep.Leases[0].Detail, "freed") {
		t.Errorf("pod-b's Lease detail %q: want it freed on a second write", rep.Leases[0].Detail)
	}
}

// The release write of the leaving Lease holder fails once (the apiserver
// answers 500): the sequence frees the Lease on a second write, within its
// budget, rather than leaving it to expire, and reports it released.
func TestFailedReleaseIsWrittenAgain(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	refuse, refused := &atomic.Bool{}, &atomic.Int64{}
	cfg := rest.CopyConfig(env.Config)
	// JSON, so the transport can read the Lease written.
	cfg.ContentType, cfg.AcceptContentTypes = "application/json", "application/json"
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return refuseReleases{rt: rt, refuse: refuse, refused: refused, once: &sync.Map{}, leases: "/leases/" + lease}
	})
	a := startPod(t, env.Pod(t, ns, "pod-a", 30), map[string]string{"lease-duration": "30s"}, worker.Options{}, kubernetes.NewForConfigOrDie(cfg).CoordinationV1())
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)
	refuse.Store(true)
	rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report: outcome %s, leases %+v, errors %q", rep.Outcome, rep.Leases, rep.Errors)
	if refused.Load() != 1 {
		t.Fatalf("%d release writes refused, want 1: the test did not test a failed release", refused.Load())
	}
	if got := holder(t, ns); got != "" {
		t.Errorf("after the sequence the Lease names %q, want none (its lease duration is 30s)", got)
	}
	if len(rep.Leases) != 1 || !rep.Leases[0].Released || len(rep.Errors) > 0 || rep.Outcome != protocol.OutcomeDrained {
		t.Errorf("report: outcome %s, leases %+v, errors %q; want Drained, the Lease released, no error", rep.Outcome, rep.Leases, rep.Errors)
	}
}

// A sequence left the Lease held (its release withheld: the old worker
// process never acknowledged the revoke, and the term it was granted
// outlasts the deadline), and the sidecar waits to re-arm for a new worker
// process. A second trigger then comes while the old process is still up
// (a preStop or the pod's deletion before the kubelet has killed it): the
// second sequence's round never ran an election, so it has no election
// that "ended without releasing". It does not free the Lease the first
// round withheld while the old process's term lasts: a successor would
// lead beside the old process. (The re-arm frees it only once the old
// process is gone.)
func TestSecondSequenceBeforeRearmKeepsAWithheldLease(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	// A long term (5 s), a short deadline (grace period 2 s, margin 1 s):
	// the term granted outlasts the deadline, so the release is withheld.
	p := startPod(t, env.Pod(t, ns, "pod-a", 2), map[string]string{"lease-duration": "10s", "renew-deadline": "5s"}, worker.Options{}, nil)
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", p.leads)
	p.neverAcknowledgeRevokes()

	first, err := p.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first sequence: outcome %s, leases %+v, errors %q", first.Outcome, first.Leases, first.Errors)
	p.calls.mu.Lock()
	until := p.calls.lastUntil
	p.calls.mu.Unlock()
	if got := holder(t, ns); got != p.settings.Identity() {
		t.Fatalf("after the first sequence the Lease names %q, want pod-a (withheld)", got)
	}
	kubetest.WaitFor(t, 5*time.Second, "re-arming", func() bool { return p.c.Status().Phase == sidecar.PhaseRearming })

	// The old process is still up (stopping, never acknowledged): a second trigger.
	second, err := p.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	t.Logf("second sequence: outcome %s, leases %+v, errors %q; old process's term ends in %s", second.Outcome, second.Leases, second.Errors, until.Sub(now))
	if !now.Before(until) {
		t.Skipf("the second sequence ended %s after the old process's term: the test proves nothing", now.Sub(until))
	}
	if got := holder(t, ns); got != p.settings.Identity() {
		t.Errorf("the second sequence freed the Lease the first withheld (now %q) while the old worker process's term lasts %s more", got, until.Sub(now))
	}
}

// loseReleaseAnswers sends the release writes of a Lease (holder identity
// empty) to the apiserver, which commits them, and then answers the client
// with an error, as a connection cut after the request went out.
type loseReleaseAnswers struct {
	rt   http.RoundTripper
	lose *atomic.Bool
	lost *atomic.Int64
}

func (r loseReleaseAnswers) RoundTrip(req *http.Request) (*http.Response, error) {
	if !r.lose.Load() || req.Method != http.MethodPut || !strings.Contains(req.URL.Path, "/leases/"+lease) || req.Body == nil {
		return r.rt.RoundTrip(req)
	}
	body, _ := io.ReadAll(req.Body)
	req.Body = io.NopCloser(bytes.NewReader(body))
	var l coordinationv1.Lease
	if json.Unmarshal(body, &l) != nil || ptr.Deref(l.Spec.HolderIdentity, "") != "" {
		return r.rt.RoundTrip(req)
	}
	resp, err := r.rt.RoundTrip(req)
	if err == nil {
		_ = resp.Body.Close()
	}
	r.lost.Add(1)
	return nil, errors.New("answer lost by the test")
}

// The leaving holder's release write lands, but its answer is lost: the
// elector reports the release failed. The sequence then reads the Lease
// (releaseLeftover), which no longer names the pod: it is free. The report
// must not call that a failed release (the hook would exit non-zero, with
// a ShutdownFailed Event, for a Lease that was released).
func TestReleaseWhoseAnswerIsLostIsNotAFailure(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	lose, lost := &atomic.Bool{}, &atomic.Int64{}
	cfg := rest.CopyConfig(env.Config)
	cfg.ContentType, cfg.AcceptContentTypes = "application/json", "application/json"
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return loseReleaseAnswers{rt: rt, lose: lose, lost: lost}
	})
	a := startPod(t, env.Pod(t, ns, "pod-a", 30), map[string]string{"lease-duration": "30s"}, worker.Options{}, kubernetes.NewForConfigOrDie(cfg).CoordinationV1())
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)
	lose.Store(true)
	rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report: outcome %s, leases %+v, errors %q", rep.Outcome, rep.Leases, rep.Errors)
	if lost.Load() == 0 {
		t.Fatal("no release answer lost: the test did not test a lost release answer")
	}
	if got := holder(t, ns); got != "" {
		t.Fatalf("after the sequence the Lease names %q, want none", got)
	}
	if len(rep.Leases) != 1 || !rep.Leases[0].Released || len(rep.Errors) > 0 {
		t.Errorf("report: outcome %s, leases %+v, errors %q; the Lease is free: want it released, no error", rep.Outcome, rep.Leases, rep.Errors)
	}
}

// The apiserver hangs (every request unanswered) as the sequence starts,
// for the leaving holder and for a standby: the elector's release write
// and then the leftover read each wait their bounds, and the sequence must
// still end by its deadline (the ReleaseBy budget), within the floor.
func TestReleaseLeftoverOnAHungAPIServerKeepsTheBudget(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	for _, name := range []string{"pod-a", "pod-b"} {
		proxy, cfg := faultproxy.ForConfig(t, env.Config)
		p := startPod(t, env.Pod(t, ns, name, 4), nil, worker.Options{}, kubernetes.NewForConfigOrDie(cfg).CoordinationV1())
		if name == "pod-a" {
			kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", p.leads)
		} else {
			kubetest.WaitFor(t, 10*time.Second, "pod-b to see pod-a hold the Lease", func() bool {
				st := p.c.Status()
				return len(st.Leases) == 1 && strings.HasPrefix(st.Leases[0].HolderIdentity, "pod-a_")
			})
		}
		if err := proxy.Hang(); err != nil {
			t.Fatal(err)
		}
		rep, err := p.c.Shutdown(context.Background(), prestop.TriggerPreStop)
		if err != nil {
			t.Fatal(err)
		}
		took := rep.Finished.Sub(rep.Started)
		t.Logf("%s: outcome %s, took %s, deadline in %s, leases %+v, errors %q", name, rep.Outcome, took, rep.Deadline.Sub(rep.Started), rep.Leases, rep.Errors)
		if over := rep.Finished.Sub(rep.Deadline); over > 250*time.Millisecond {
			t.Errorf("%s: the sequence ended %s past its deadline", name, over)
		}
		if name == "pod-a" && (len(rep.Errors) == 0 || len(rep.Leases) != 1 || rep.Leases[0].Released) {
			t.Errorf("%s: the Lease was not released on a hung apiserver: want a failure in the report", name)
		}
		if name == "pod-b" && len(rep.Errors) != 0 {
			t.Errorf("%s: a standby's sequence reports errors %q", name, rep.Errors)
		}
		if err := proxy.Restore(); err != nil {
			t.Fatal(err)
		}
	}
}

// failGets answers every GET of a Lease with an error while fail is set.
type failGets struct {
	next http.RoundTripper
	fail *atomic.Bool
}

func (f failGets) RoundTrip(req *http.Request) (*http.Response, error) {
	if f.fail.Load() && req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/leases") {
		return nil, errors.New("read refused by the test")
	}
	return f.next.RoundTrip(req)
}

// A standby's acquiring write lands, its answer is lost, and its pod's
// sequence starts; the leftover read that would free the Lease fails. The
// Lease names the pod, unrenewed, for a lease duration: the report must
// not say Drained with no error and the Lease not led (the hook exits 0,
// no Event says the Lease is held).
func TestLostAcquisitionWithAFailedLeftoverReadIsReported(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	a := newPod(t, ns, "pod-a", nil, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)
	h := &holdAnswer{lose: true, written: make(chan struct{}), answer: make(chan struct{})}
	fail := &atomic.Bool{}
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(func(next http.RoundTripper) http.RoundTripper { h.next = failGets{next: next, fail: fail}; return h })
	b := startPod(t, env.Pod(t, ns, "pod-b", 30), nil, worker.Options{}, kubernetes.NewForConfigOrDie(cfg).CoordinationV1())
	kubetest.WaitFor(t, 10*time.Second, "pod-b to see pod-a hold the Lease", func() bool {
		st := b.c.Status()
		return len(st.Leases) == 1 && strings.HasPrefix(st.Leases[0].HolderIdentity, "pod-a_")
	})
	h.armed.Store(true)
	if _, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.written:
	case <-time.After(10 * time.Second):
		t.Fatal("pod-b sent no acquiring write within 10s of pod-a's release")
	}
	reports := make(chan *protocol.Report, 1)
	go func() {
		rep, err := b.c.Shutdown(context.Background(), prestop.TriggerPreStop)
		if err != nil {
			t.Error(err)
		}
		reports <- rep
	}()
	kubetest.WaitFor(t, time.Second, "pod-b's sequence to start", func() bool { return b.c.Status().Phase != sidecar.PhaseRunning })
	fail.Store(true)
	close(h.answer)
	rep := <-reports
	if rep == nil {
		t.FailNow()
	}
	t.Logf("pod-b's report: outcome %s, leases %+v, errors %q", rep.Outcome, rep.Leases, rep.Errors)
	got := holder(t, ns)
	if !strings.HasPrefix(got, "pod-b_") {
		t.Skipf("the Lease names %q after pod-b's sequence: nothing left held", got)
	}
	if len(rep.Errors) == 0 {
		t.Errorf("the Lease names pod-b after its sequence, unrenewed, and the report says %s with no error: leases %+v", rep.Outcome, rep.Leases)
	}
}
