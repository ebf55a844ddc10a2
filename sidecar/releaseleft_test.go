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
