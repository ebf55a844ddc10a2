package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/internal/sockettest"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/sidecar"
	"github.com/handoff-dev/handoff/worker"
)

func TestMain(m *testing.M) { kubetest.Run(m) }

const lease = "work"

// pod is one worker pod run in the test: a Pod object in the real API, a
// sidecar Coordinator, and an app served by worker.Agent on loopback.
type pod struct {
	name     string
	uid      string
	c        *sidecar.Coordinator
	agent    *worker.Agent
	settings *config.Settings
	calls    *appCalls
	app      atomic.Pointer[http.Handler] // the worker process now serving the app API
	appAddr  protocol.Endpoint            // the app API's socket
	appLn    net.Listener                 // serves the app API
	metrics  *sidecar.Metrics
	recorder record.EventRecorder
	leases   coordinationv1client.LeasesGetter // nil: the test's client
	stop     func()                            // ends the sidecar
}

// restartApp replaces the worker process behind the app API with a new one,
// as the kubelet's restart of the worker container does.
func (p *pod) restartApp(t *testing.T, opts worker.Options) {
	t.Helper()
	opts.Logger = testr.New(t).WithName(p.name + "/app2")
	p.agent = newAgent(t, opts)
	h := p.agent.Handler()
	p.app.Store(&h)
}

// appCalls counts the sidecar's calls to the app, by path.
type appCalls struct {
	mu        sync.Mutex
	n         map[string]int
	lastUntil time.Time // the latest Until granted to the app
	grants    []protocol.Leadership
	revokes   []time.Time // when each Leadership with leader false arrived
}

// grantsSince counts the grants that arrived after t (by their Sequence,
// which is the send time).
func (a *appCalls) grantsSince(t time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, g := range a.grants {
		if g.Sequence > t.UnixNano() {
			n++
		}
	}
	return n
}

// lastGrant is the latest grant the app was sent.
func (a *appCalls) lastGrant() (protocol.Leadership, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.grants) == 0 {
		return protocol.Leadership{}, false
	}
	return a.grants[len(a.grants)-1], true
}

func (a *appCalls) count(path string) int { a.mu.Lock(); defer a.mu.Unlock(); return a.n[path] }

// newPod starts a pod; values override the test defaults by setting name.
func newPod(t *testing.T, ns, name string, values map[string]string, opts worker.Options) *pod {
	t.Helper()
	return startPod(t, kubetest.Get(t).Pod(t, ns, name, 30), values, opts, nil)
}

// startPod starts a pod for the Pod object obj, already created.
// leases, if not nil, is the sidecar's Lease client.
func startPod(t *testing.T, obj *corev1.Pod, values map[string]string, opts worker.Options, leases coordinationv1client.LeasesGetter) *pod {
	t.Helper()
	env := kubetest.Get(t)
	ns, name := obj.Namespace, obj.Name
	p := &pod{name: name, leases: leases, calls: &appCalls{n: map[string]int{}}, metrics: sidecar.NewMetrics(prometheus.NewRegistry())}
	p.uid = string(obj.UID)
	opts.Logger = testr.New(t).WithName(name + "/app")
	p.agent = newAgent(t, opts)
	h0 := p.agent.Handler()
	p.app.Store(&h0)
	p.appAddr, p.appLn = sockettest.Serve(t, "app.sock", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := *p.app.Load()
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var l protocol.Leadership
		p.calls.mu.Lock()
		p.calls.n[r.URL.Path]++
		if r.Method == http.MethodPut && json.Unmarshal(body, &l) == nil {
			if l.Leader && l.Until.After(p.calls.lastUntil) {
				p.calls.lastUntil = l.Until
			}
			if l.Leader {
				p.calls.grants = append(p.calls.grants, l)
			} else {
				p.calls.revokes = append(p.calls.revokes, time.Now())
			}
		}
		p.calls.mu.Unlock()
		h.ServeHTTP(w, r)
	}))

	v := map[string]string{
		"pod-name": name, "pod-namespace": ns, "pod-uid": p.uid, "leases": lease,
		"lease-duration": "3s", "renew-deadline": "2s", "retry-period": "250ms",
		"grace-period": "30s", "deadline-margin": "1s", "handback-reserve": "1s",
		"app-url": p.appAddr.String(),
	}
	for k, val := range values {
		v[k] = val
	}
	s, err := config.Load(config.Map(v, "test"))
	if err != nil {
		t.Fatal(err)
	}
	p.settings = s
	p.recorder = func() record.EventRecorder {
		b := record.NewBroadcaster()
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: env.Client.CoreV1().Events(ns)})
		t.Cleanup(b.Shutdown)
		return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "handoff"})
	}()
	p.c, p.stop = p.startSidecar(t, p.metrics)
	return p
}

// startSidecar makes and starts a Coordinator for the pod (one sidecar
// process); stop ends it (its context, then Wait).
func (p *pod) startSidecar(t *testing.T, m *sidecar.Metrics) (c *sidecar.Coordinator, stop func()) {
	t.Helper()
	env := kubetest.Get(t)
	var leases coordinationv1client.LeasesGetter = env.Client.CoordinationV1()
	if p.leases != nil {
		leases = p.leases
	}
	c, err := sidecar.New(sidecar.Options{Token: testToken,
		Settings: p.settings, Leases: leases, Pods: env.Client.CoreV1(),
		Events: p.recorder, Metrics: m, Logger: testr.New(t).WithName(p.name),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx)
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); c.Wait() }) }
	t.Cleanup(stop)
	return c, stop
}

func (p *pod) leads() bool { _, ok := p.agent.Leader(lease); return ok }

// leaderAndStandby starts two pods and returns them as (leader, standby),
// once the leader's app has been told it leads.
func leaderAndStandby(t *testing.T, ns string, values map[string]string, opts worker.Options) (*pod, *pod) {
	a := newPod(t, ns, "pod-a", values, opts)
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)
	b := newPod(t, ns, "pod-b", values, opts)
	return a, b
}

// events returns the messages of the pod's Events with reason, waiting
// until at least one is there.
func events(t *testing.T, ns, podName, reason string) []string {
	t.Helper()
	var msgs []string
	kubetest.WaitFor(t, 5*time.Second, "a "+reason+" Event on "+podName, func() bool {
		list, err := kubetest.Get(t).Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + podName + ",reason=" + reason})
		if err != nil {
			return false
		}
		msgs = msgs[:0]
		for _, e := range list.Items {
			msgs = append(msgs, e.Message)
		}
		return len(msgs) > 0
	})
	return msgs
}

func stepNames(rep *protocol.Report) []string {
	var names []string
	for _, s := range rep.Steps {
		names = append(names, string(s.Name))
	}
	return names
}

func TestShutdownDrainsReleasesAndStandbyLeads(t *testing.T) {
	ns := kubetest.Get(t).Namespace(t)
	a, b := leaderAndStandby(t, ns, nil, worker.Options{})

	// Leader work on a; when it ended.
	var leaderWorkEnded atomic.Int64
	lctx, first, done, err := a.agent.BeginLeading(context.Background(), lease)
	if err != nil {
		t.Fatal(err)
	}
	go func() { <-lctx.Done(); leaderWorkEnded.Store(time.Now().UnixNano()); done() }()
	// Two claims that finish 300 ms after stop-claiming.
	for range 2 {
		_, done, err := a.agent.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		go func() { <-a.agent.Stopping(); time.Sleep(300 * time.Millisecond); done() }()
	}

	rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Outcome != protocol.OutcomeDrained {
		t.Errorf("outcome = %s, want Drained; errors %v", rep.Outcome, rep.Errors)
	}
	if want := []string{"triggered", "stop-claiming", "drained", "leadership-revoked", "lease-released", "done"}; strings.Join(stepNames(rep), ",") != strings.Join(want, ",") {
		t.Errorf("steps = %v, want %v", stepNames(rep), want)
	}
	if len(rep.Leases) != 1 || !rep.Leases[0].WasLeader || !rep.Leases[0].Released {
		t.Errorf("leases = %+v, want %s released", rep.Leases, lease)
	}
	if !rep.Finished.Before(rep.Deadline) {
		t.Errorf("finished %s after the deadline %s", rep.Finished, rep.Deadline)
	}
	if a.leads() {
		t.Error("a's app still leads after the sequence")
	}
	if _, _, err := a.agent.Begin(context.Background()); !errors.Is(err, worker.ErrStopping) {
		t.Errorf("Begin after stop-claiming = %v, want ErrStopping", err)
	}

	took := kubetest.WaitFor(t, 3*time.Second, "b's app to lead", b.leads)
	t.Logf("standby leading %s after the release", took.Sub(rep.Finished))
	second, _ := b.agent.Leader(lease)
	if second.FencingToken <= first.FencingToken {
		t.Errorf("b's fencing token %d is not above a's %d", second.FencingToken, first.FencingToken)
	}
	l, err := kubetest.Get(t).Client.CoordinationV1().Leases(ns).Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ended := time.Unix(0, leaderWorkEnded.Load()); ended.IsZero() || !ended.Before(l.Spec.AcquireTime.Time) {
		t.Errorf("a's leader work ended at %s, not before b acquired the Lease at %s", ended, l.Spec.AcquireTime.Time)
	}
	for _, reason := range []string{sidecar.ReasonLeaseAcquired, sidecar.ReasonDrainStarted, sidecar.ReasonDrained, sidecar.ReasonLeaseReleased} {
		events(t, ns, "pod-a", reason)
	}
}

func TestFallbackAtDrainDeadline(t *testing.T) {
	for _, policy := range []config.Fallback{config.FallbackReturn, config.FallbackCancel, config.FallbackAbandon} {
		t.Run(string(policy), func(t *testing.T) {
			t.Parallel()
			env := kubetest.Get(t)
			ns := env.Namespace(t)
			var returnCalls atomic.Int32
			var canceled atomic.Int32
			opts := worker.Options{ReturnClaims: func(context.Context) (int, error) { returnCalls.Add(1); return 3, nil }}
			a, b := leaderAndStandby(t, ns, map[string]string{"fallback": string(policy)}, opts)
			// Three claims that never finish unless canceled.
			for range 3 {
				ctx, done, err := a.agent.Begin(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				go func() { <-ctx.Done(); canceled.Add(1); done() }()
			}
			// A delete with a 5 s grace period sets the deadline.
			grace := int64(5)
			if err := env.Client.CoreV1().Pods(ns).Delete(context.Background(), "pod-a", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
				t.Fatal(err)
			}
			obj, err := env.Client.CoreV1().Pods(ns).Get(context.Background(), "pod-a", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}

			rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
			if err != nil {
				t.Fatal(err)
			}
			if want := obj.DeletionTimestamp.Add(-a.settings.DeadlineMargin); !rep.Deadline.Equal(want) || rep.DeadlineSource != prestop.SourceDeletionTimestamp {
				t.Errorf("deadline %s from %s, want %s from the deletionTimestamp", rep.Deadline, rep.DeadlineSource, want)
			}
			if !rep.Finished.Before(rep.Deadline) {
				t.Errorf("finished %s after the deadline %s", rep.Finished, rep.Deadline)
			}
			if rep.InFlightAtDeadline != 3 {
				t.Errorf("in flight at deadline = %d, want 3", rep.InFlightAtDeadline)
			}
			if !rep.Leases[0].Released {
				t.Errorf("Lease not released: %+v", rep.Leases[0])
			}
			msgs := events(t, ns, "pod-a", sidecar.ReasonDeadlineExceeded)
			switch policy {
			case config.FallbackReturn:
				if rep.Outcome != protocol.OutcomeReturned || rep.Returned != 3 || returnCalls.Load() != 1 || canceled.Load() != 0 {
					t.Errorf("outcome %s, returned %d, ReturnClaims calls %d, canceled %d: want Returned 3 1 0", rep.Outcome, rep.Returned, returnCalls.Load(), canceled.Load())
				}
				if !strings.Contains(msgs[0], "3 claims in flight") || !strings.Contains(msgs[0], "3 returned") {
					t.Errorf("event %q does not give the counts", msgs[0])
				}
			case config.FallbackCancel:
				if rep.Outcome != protocol.OutcomeCanceled || rep.Returned != 3 || canceled.Load() != 3 {
					t.Errorf("outcome %s, returned %d, canceled %d: want Canceled 3 3", rep.Outcome, rep.Returned, canceled.Load())
				}
			case config.FallbackAbandon:
				if rep.Outcome != protocol.OutcomeAbandoned || returnCalls.Load() != 0 {
					t.Errorf("outcome %s, ReturnClaims calls %d: want Abandoned 0", rep.Outcome, returnCalls.Load())
				}
			}
			kubetest.WaitFor(t, 3*time.Second, "the standby to lead", b.leads)
		})
	}
}

func TestDeadlineFollowsShortenedGracePeriod(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	a := newPod(t, ns, "pod-a", map[string]string{"leases": "", "grace-period": "30s"}, worker.Options{})
	_, done, err := a.agent.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(done)
	// kubectl delete pod --grace-period=3 on a pod whose spec says 30.
	grace := int64(3)
	start := time.Now()
	if err := env.Client.CoreV1().Pods(ns).Delete(context.Background(), "pod-a", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	if rep.DeadlineSource != prestop.SourceDeletionTimestamp {
		t.Errorf("deadline source %s, want %s", rep.DeadlineSource, prestop.SourceDeletionTimestamp)
	}
	if limit := start.Add(3 * time.Second); rep.Deadline.After(limit) {
		t.Errorf("deadline %s after trigger, want within the 3 s grace period", rep.Deadline.Sub(start))
	}
	if !rep.Finished.Before(rep.Deadline) {
		t.Errorf("finished %s after the deadline %s", rep.Finished.Sub(start), rep.Deadline.Sub(start))
	}
}

func TestConcurrentTriggersJoinOneSequence(t *testing.T) {
	ns := kubetest.Get(t).Namespace(t)
	a := newPod(t, ns, "pod-a", nil, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)
	control, _ := sockettest.Serve(t, "control.sock", a.c.ControlHandler())

	reports := make([]*protocol.Report, 9)
	errs := make([]error, 9)
	var wg sync.WaitGroup
	for i := range reports {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i == 0 {
				reports[i], errs[i] = a.c.Shutdown(context.Background(), sidecar.TriggerSignal)
				return
			}
			reports[i], errs[i] = prestop.Call(context.Background(), control, testToken, time.Second)
		}()
	}
	wg.Wait()
	for i := range reports {
		if errs[i] != nil {
			t.Fatalf("trigger %d: %v", i, errs[i])
		}
		if !reports[i].Started.Equal(reports[0].Started) || reports[i].Outcome != reports[0].Outcome {
			t.Errorf("trigger %d got report started %s, trigger 0 got %s: want one sequence", i, reports[i].Started, reports[0].Started)
		}
	}
	if n := a.calls.count(protocol.StopClaimingPath); n != 1 {
		t.Errorf("stop-claiming called %d times, want 1", n)
	}
	if n := a.calls.count(protocol.LeasePathPrefix + lease); n < 1 {
		t.Errorf("leadership calls = %d, want the grant and one revoke", n)
	}
	if st := a.c.Status(); st.Phase != sidecar.PhaseDone || st.Report == nil {
		t.Errorf("status phase %s, report %v: want Done with the report", st.Phase, st.Report)
	}
}

func TestAppGoneStillReleasesLease(t *testing.T) {
	ns := kubetest.Get(t).Namespace(t)
	a := newPod(t, ns, "pod-a", map[string]string{"app-url": "http://127.0.0.1:1"}, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a to hold the Lease", func() bool {
		st := a.c.Status()
		return len(st.Leases) == 1 && st.Leases[0].Leader
	})
	rep, err := a.c.Shutdown(context.Background(), sidecar.TriggerSignal)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Outcome != protocol.OutcomeAppGone || !rep.Leases[0].Released {
		t.Errorf("outcome %s, leases %+v: want AppGone and the Lease released", rep.Outcome, rep.Leases)
	}
}

func TestUnacknowledgedRevokeReleasesOnlyAfterTheAppsTerm(t *testing.T) {
	ns := kubetest.Get(t).Namespace(t)
	a, b := leaderAndStandby(t, ns, nil, worker.Options{})
	// Leader work that ignores its context: the revoke is never acknowledged.
	if _, _, _, err := a.agent.BeginLeading(context.Background(), lease); err != nil {
		t.Fatal(err)
	}
	rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Errors) == 0 {
		t.Error("no error recorded for the unacknowledged revoke")
	}
	kubetest.WaitFor(t, 5*time.Second, "b to lead", b.leads)
	l, err := kubetest.Get(t).Client.CoordinationV1().Leases(ns).Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The app may lead until the last term it was given; b must not have
	// acquired before that.
	a.calls.mu.Lock()
	lastTerm := a.calls.lastUntil
	a.calls.mu.Unlock()
	if acquired := l.Spec.AcquireTime.Time; acquired.Before(lastTerm) {
		t.Errorf("b acquired at %s, before a's app term ended at %s", acquired, lastTerm)
	}
	t.Logf("report: %+v", rep.Leases)
}
