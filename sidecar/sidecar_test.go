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

	"net/http/httptest"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/internal/outcome"
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
	grantedAt []time.Time // when each of grants arrived
	revokes   []time.Time // when each Leadership with leader false arrived
}

// firstGrantAfter is when the first grant that arrived after t arrived;
// zero if none.
func (a *appCalls) firstGrantAfter(t time.Time) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, at := range a.grantedAt {
		if at.After(t) {
			return at
		}
	}
	return time.Time{}
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
				p.calls.grantedAt = append(p.calls.grantedAt, time.Now())
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
		b := record.NewBroadcaster(record.WithCorrelatorOptions(sidecar.CorrelatorOptions()))
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
			// The pod's summary, which the webhook counts, says the same.
			sum, typ := summary(t, ns, "pod-a")
			want := outcome.Claims{Unfinished: 3, Returned: rep.Returned, Abandoned: rep.Abandoned}
			if sum.Outcome != rep.Outcome || sum.Claims != want || len(sum.Leases) != 1 || sum.Leases[0].Result != outcome.ResultReleased {
				t.Errorf("summary %+v: want outcome %s, claims %+v, its Lease released", sum, rep.Outcome, want)
			}
			if _, ok := sum.Steps[sidecar.StepDrainDeadline]; !ok {
				t.Errorf("summary steps %v: no %s", sum.Steps, sidecar.StepDrainDeadline)
			}
			if wantType := map[bool]string{true: corev1.EventTypeWarning, false: corev1.EventTypeNormal}[policy == config.FallbackAbandon]; typ != wantType {
				t.Errorf("%s Event of type %s, want %s", sidecar.ReasonShutdownFinished, typ, wantType)
			}
			kubetest.WaitFor(t, 3*time.Second, "the standby to lead", b.leads)
		})
	}
}

// summary is the one ShutdownFinished Event's summary on pod podName, and
// the Event's type.
func summary(t *testing.T, ns, podName string) (outcome.Summary, string) {
	t.Helper()
	var list *corev1.EventList
	kubetest.WaitFor(t, 5*time.Second, "a "+sidecar.ReasonShutdownFinished+" Event on "+podName, func() bool {
		var err error
		list, err = kubetest.Get(t).Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + podName + ",reason=" + sidecar.ReasonShutdownFinished})
		return err == nil && len(list.Items) > 0
	})
	if len(list.Items) != 1 {
		t.Fatalf("%d %s Events on %s, want 1", len(list.Items), sidecar.ReasonShutdownFinished, podName)
	}
	s, err := outcome.Decode(list.Items[0].Annotations[outcome.Annotation])
	if err != nil {
		t.Fatal(err)
	}
	return s, list.Items[0].Type
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

// One failed stop-claiming call (here a 500 once; in practice a timeout of
// its 1 s bound under CPU throttling, or a reset connection) is asked
// again while the drain status says stopping:false: the worker stops
// claiming and, idle, drains at once. Not asked again, it would go on
// claiming until the drain deadline and the fallback.
func TestFailedStopClaimingIsAskedAgain(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	p := startPod(t, env.Pod(t, ns, "pod-a", 5), nil, worker.Options{}, nil)
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", p.leads)
	// The worker waits for messages, as an idle consumer does.
	r, err := p.agent.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	go func() { <-r.Context().Done(); r.End() }()
	inner := *p.app.Load()
	var refused atomic.Bool
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == protocol.StopClaimingPath && refused.CompareAndSwap(false, true) {
			http.Error(w, "busy", http.StatusInternalServerError)
			return
		}
		inner.ServeHTTP(w, req)
	})
	p.app.Store(&h)

	rep, err := p.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sequence: outcome %s, errors %q, stop-claiming calls %d", rep.Outcome, rep.Errors, p.calls.count(protocol.StopClaimingPath))
	select {
	case <-p.agent.Stopping():
	default:
		t.Errorf("the sequence ended (%s) and the worker was never told to stop claiming: one refused call, not retried", rep.Outcome)
	}
	if rep.Outcome != protocol.OutcomeDrained {
		t.Errorf("outcome %s, want Drained: the idle worker drains at once once told", rep.Outcome)
	}
}

// The sidecar serves the control API before Start: a preStop in that window
// must run the sequence, not call a nil cancel func.
func TestShutdownBeforeStart(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	obj := env.Pod(t, ns, "pod-a", 30)
	agent := newAgent(t, worker.Options{Logger: testr.New(t)})
	app := httptest.NewServer(agent.Handler())
	t.Cleanup(app.Close)
	s, err := config.Load(config.Map(map[string]string{
		"pod-name": "pod-a", "pod-namespace": ns, "pod-uid": string(obj.UID), "leases": lease,
		"lease-duration": "3s", "renew-deadline": "2s", "retry-period": "250ms", "app-url": app.URL,
	}, "test"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := sidecar.New(sidecar.Options{Token: testToken, Settings: s, Leases: env.Client.CoordinationV1(), Pods: env.Client.CoreV1(),
		Metrics: sidecar.NewMetrics(prometheus.NewRegistry()), Logger: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	control, _ := sockettest.Serve(t, "control.sock", c.ControlHandler())
	rep, err := prestop.Call(context.Background(), control, testToken, time.Second)
	if err != nil {
		t.Fatalf("preStop before Start: %v", err)
	}
	if rep.Outcome != protocol.OutcomeDrained || len(rep.Errors) > 0 || len(rep.Leases) != 1 || rep.Leases[0].WasLeader {
		t.Errorf("report %+v: want Drained, no error, the Lease not held", rep)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx) // after the sequence: the round is over, no election starts
	cancel()
	c.Wait()
}

// Once the sequence has started, a Lease the pod loses is not competed for
// again, and no new grant reaches the stopping app.
func TestLeaseLostDuringDrainIsNotRetaken(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	a := newPod(t, ns, "pod-a", nil, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)
	_, done, err := a.agent.Begin(context.Background()) // keeps the drain going
	if err != nil {
		t.Fatal(err)
	}
	reports := make(chan *protocol.Report, 1)
	go func() {
		rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
		if err != nil {
			t.Error(err)
		}
		reports <- rep
	}()
	<-a.agent.Stopping()

	// Another candidate takes the Lease; pod-a's renewals fail until its
	// renew deadline, and it loses it.
	leases := env.Client.CoordinationV1().Leases(ns)
	steal := func(holder string) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			l, err := leases.Get(context.Background(), lease, metav1.GetOptions{})
			if err != nil {
				return err
			}
			l.Spec.HolderIdentity = ptr.To(holder)
			l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			_, err = leases.Update(context.Background(), l, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	steal("thief")
	kubetest.WaitFor(t, 10*time.Second, "pod-a to see it lost the Lease", func() bool {
		st := a.c.Status()
		return !st.Leases[0].Leader && st.Leases[0].HolderIdentity == "thief"
	})
	lost := time.Now() // no renewal of the old term after this
	// The thief frees it: a pod still competing would take it at once
	// (its standby watches the Lease).
	steal("")
	time.Sleep(1500 * time.Millisecond) // six retry periods: room for a re-acquisition to show
	l, err := leases.Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "" {
		t.Errorf("the Lease is held by %q after the thief freed it: the leaving pod competed again", h)
	}
	if n := a.calls.grantsSince(lost); n > 0 {
		t.Errorf("%d grants reached the stopping app after it lost the Lease", n)
	}
	done()
	rep := <-reports
	if rep == nil || rep.Outcome != protocol.OutcomeDrained {
		t.Fatalf("report %+v, want Drained", rep)
	}
}

// An app that answers the drain poll at once, ignoring waitMillis, is
// polled at most once per pacing interval.
func TestDrainPollsArePaced(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	a := newPod(t, ns, "pod-a", map[string]string{"leases": ""}, worker.Options{})
	if _, _, err := a.agent.Begin(context.Background()); err != nil { // never finishes
		t.Fatal(err)
	}
	inner := a.agent.Handler()
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == protocol.DrainPath {
			q := r.URL.Query()
			q.Set("waitMillis", "0") // the app does not wait
			r.URL.RawQuery = q.Encode()
		}
		inner.ServeHTTP(w, r)
	})
	a.app.Store(&h)
	grace := int64(4)
	if err := env.Client.CoreV1().Pods(ns).Delete(context.Background(), "pod-a", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	var from, to time.Time
	for _, s := range rep.Steps {
		switch s.Name {
		case sidecar.StepStopClaiming:
			from = s.At
		case sidecar.StepDrainDeadline:
			to = s.At
		}
	}
	if from.IsZero() || to.IsZero() {
		t.Fatalf("steps %v: want stop-claiming and drain-deadline", stepNames(rep))
	}
	polls := a.calls.count(protocol.DrainPath)
	if most := int(to.Sub(from)/(100*time.Millisecond)) + 2; polls > most {
		t.Errorf("%d drain polls in %s, want at most %d (one per 100ms)", polls, to.Sub(from), most)
	}
	t.Logf("%d drain polls in %s", polls, to.Sub(from))
}

// A new sidecar process with the same identity (the kubelet restarted the
// sidecar container) picks up the Lease that still names it, without
// waiting for it to expire, and tells the worker with a higher sequence and
// the same fencing token: it is the same holder.
func TestRestartedSidecarPicksUpItsLease(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	a := newPod(t, ns, "pod-a", nil, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)

	// The sidecar process dies: no revoke, no release.
	a.c.Abandon()
	a.stop()
	before, _ := a.calls.lastGrant()
	leases := env.Client.CoordinationV1().Leases(ns)
	held, err := leases.Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptr.Deref(held.Spec.HolderIdentity, ""); h != a.settings.Identity() {
		t.Fatalf("after the kill the Lease names %q, want %q", h, a.settings.Identity())
	}
	// A standby could take the Lease from here on (client-go compares
	// renew times at one-second resolution).
	expires := held.Spec.RenewTime.Time.Truncate(time.Second).Add(time.Duration(*held.Spec.LeaseDurationSeconds) * time.Second)

	a.c, a.stop = a.startSidecar(t, sidecar.NewMetrics(prometheus.NewRegistry()))
	var after protocol.Leadership
	kubetest.WaitFor(t, 10*time.Second, "the new sidecar's grant", func() bool {
		a.calls.mu.Lock()
		defer a.calls.mu.Unlock()
		for _, g := range a.calls.grants {
			if g.Sequence > before.Sequence {
				after = g
				return true
			}
		}
		return false
	})
	if after.FencingToken != before.FencingToken {
		t.Errorf("fencing token %d after the restart, want the same holder's %d", after.FencingToken, before.FencingToken)
	}
	if sent := time.Unix(0, after.Sequence); !sent.Before(expires) {
		t.Errorf("the new sidecar granted at %s, not before the Lease could expire at %s: it waited the Lease out", sent, expires)
	}
	again, err := leases.Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ptr.Deref(again.Spec.HolderIdentity, "") != a.settings.Identity() || ptr.Deref(again.Spec.LeaseTransitions, 0) != ptr.Deref(held.Spec.LeaseTransitions, 0) {
		t.Errorf("Lease holder %q, transitions %d: want %q and %d (renewed by the same holder, not taken over)",
			ptr.Deref(again.Spec.HolderIdentity, ""), ptr.Deref(again.Spec.LeaseTransitions, 0), a.settings.Identity(), ptr.Deref(held.Spec.LeaseTransitions, 0))
	}
	kubetest.WaitFor(t, 5*time.Second, "the app to lead under the new sidecar", a.leads)
}

// hangingLeases is a Lease client whose writes hang, once hang is set,
// until their context ends: a holder cut off from the API.
type hangingLeases struct {
	coordinationv1client.LeasesGetter
	hang *atomic.Bool
}

func (h hangingLeases) Leases(ns string) coordinationv1client.LeaseInterface {
	return hangingLease{h.LeasesGetter.Leases(ns), h.hang}
}

type hangingLease struct {
	coordinationv1client.LeaseInterface
	hang *atomic.Bool
}

func (h hangingLease) Update(ctx context.Context, l *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if h.hang.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return h.LeaseInterface.Update(ctx, l, o)
}

// Patch hangs as Update does: the leftover release's write.
func (h hangingLease) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, o metav1.PatchOptions, sub ...string) (*coordinationv1.Lease, error) {
	if h.hang.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return h.LeaseInterface.Patch(ctx, name, pt, data, o, sub...)
}

// When the holder's Lease writes hang past its renew deadline, the app is
// told its term is over at the end of the term it was granted, before the
// standby takes the Lease, not when client-go gives up after its release
// attempt.
func TestAppToldAtTheEndOfItsTermWhenRenewalsHang(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	var hang atomic.Bool
	a := startPod(t, env.Pod(t, ns, "pod-a", 30), nil, worker.Options{}, hangingLeases{env.Client.CoordinationV1(), &hang})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)
	b := newPod(t, ns, "pod-b", nil, worker.Options{})
	hang.Store(true)
	kubetest.WaitFor(t, 15*time.Second, "b's app to lead", b.leads)
	l, err := env.Client.CoordinationV1().Leases(ns).Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	acquired := l.Spec.AcquireTime.Time
	a.calls.mu.Lock()
	revokes, lastUntil := append([]time.Time(nil), a.calls.revokes...), a.calls.lastUntil
	a.calls.mu.Unlock()
	if len(revokes) == 0 {
		t.Fatalf("a's app was never told its term ended; b acquired at %s", acquired)
	}
	if !revokes[0].Before(acquired) {
		t.Errorf("a's app told its term ended at %s, after b acquired the Lease at %s (a's last term until %s)", revokes[0], acquired, lastUntil)
	}
}

// exitOn makes the pod's app exit, the way a process does, when it gets a
// request that matches: it stops listening (later connections are refused)
// and resets the connection of that request.
func (p *pod) exitOn(t *testing.T, match func(*http.Request, []byte) bool) {
	t.Helper()
	inner := *p.app.Load()
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !match(r, body) {
			inner.ServeHTTP(w, r)
			return
		}
		_ = p.appLn.Close() // the socket is removed: later dials find none
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		if tcp, ok := conn.(*net.TCPConn); ok {
			_ = tcp.SetLinger(0) // RST, not FIN
		}
		_ = conn.Close()
	})
	p.app.Store(&h)
}

// An app that finishes and exits at once resets the connection of the
// revoke: it is gone, so its term is over; the sequence does not wait the
// term out and reports no error (the hook exits 0).
func TestAppThatExitsAtTheRevokeIsGone(t *testing.T) {
	ns := kubetest.Get(t).Namespace(t)
	a := newPod(t, ns, "pod-a", nil, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)
	a.exitOn(t, func(r *http.Request, body []byte) bool {
		var l protocol.Leadership
		return r.Method == http.MethodPut && json.Unmarshal(body, &l) == nil && !l.Leader
	})
	rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Errors) > 0 || !rep.Leases[0].Released || strings.Contains(rep.Leases[0].Detail, "waited") {
		t.Errorf("errors %v, lease %+v: want no error and the Lease released at once", rep.Errors, rep.Leases[0])
	}
	if want := []string{"triggered", "stop-claiming", "drained", "leadership-revoked", "lease-released", "done"}; strings.Join(stepNames(rep), ",") != strings.Join(want, ",") {
		t.Errorf("steps %v, want %v", stepNames(rep), want)
	}
}

// An app that exits mid-drain with claims in flight leaves them to the
// visibility timeout: the report counts them from its last status.
func TestAppGoneMidDrainCountsAbandonedClaims(t *testing.T) {
	ns := kubetest.Get(t).Namespace(t)
	a := newPod(t, ns, "pod-a", map[string]string{"leases": ""}, worker.Options{})
	for range 2 {
		if _, _, err := a.agent.Begin(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	a.exitOn(t, func(r *http.Request, _ []byte) bool { return r.URL.Path == protocol.DrainPath })
	rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Outcome != protocol.OutcomeAppGone || rep.Abandoned != 2 || len(rep.Errors) > 0 {
		t.Errorf("outcome %s, abandoned %d, errors %v: want AppGone, 2, none", rep.Outcome, rep.Abandoned, rep.Errors)
	}
	// An app gone writes no drain Event: the summary is its only record.
	if sum, _ := summary(t, ns, "pod-a"); sum.Outcome != protocol.OutcomeAppGone || sum.Claims.Abandoned != 2 {
		t.Errorf("summary %+v: want AppGone with 2 abandoned", sum)
	}
}

// A release that is not written (the Lease writes hang until the release's
// context ends) is a failure of the sequence: the report carries the error,
// so `handoff prestop` exits non-zero, and a HandoverFailed Event says why.
func TestReleaseNotWrittenFailsTheSequence(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	var hang atomic.Bool
	a := startPod(t, env.Pod(t, ns, "pod-a", 30), nil, worker.Options{}, hangingLeases{env.Client.CoordinationV1(), &hang})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)
	hang.Store(true)
	rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Leases) != 1 || rep.Leases[0].Released || !rep.Leases[0].WasLeader {
		t.Fatalf("Leases in the report %+v; want %s, was leader, not released", rep.Leases, lease)
	}
	if len(rep.Errors) == 0 || !strings.Contains(strings.Join(rep.Errors, "\n"), "releasing Lease "+lease) {
		t.Errorf("report errors %q; want the release of %s named", rep.Errors, lease)
	}
	kubetest.WaitFor(t, 10*time.Second, "the HandoverFailed Event", func() bool {
		return len(events(t, ns, "pod-a", sidecar.ReasonHandoverFailed)) == 1
	})
}
