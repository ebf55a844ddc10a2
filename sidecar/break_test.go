package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	corev1 "k8s.io/api/core/v1"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/internal/sockettest"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/sidecar"
	"github.com/handoff-dev/handoff/worker"
)

// gatedPods is the real API's pods client whose next Get, once armed,
// waits for gate: a slow read of the pod, to open a race window.
type gatedPods struct {
	typedcorev1.CoreV1Interface
	armed   atomic.Bool
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedPods) Pods(ns string) typedcorev1.PodInterface {
	return &gatedPodIf{PodInterface: g.CoreV1Interface.Pods(ns), g: g}
}

type gatedPodIf struct {
	typedcorev1.PodInterface
	g *gatedPods
}

func (p *gatedPodIf) Get(ctx context.Context, name string, o metav1.GetOptions) (*corev1.Pod, error) {
	if p.g.armed.CompareAndSwap(true, false) {
		close(p.g.entered)
		<-p.g.gate
	}
	return p.PodInterface.Get(ctx, name, o)
}

// SIGTERM to the sidecar (Signal) in a pod that stays, racing a preStop:
// Signal saw no sequence, then read the pod; meanwhile the preStop started a
// sequence. Signal must then join the sequence (the sidecar stays until it
// is over) rather than take the SIGTERM for a sidecar restart: that exits
// the sidecar in the middle of the sequence and withholds the release the
// running sequence is about to write.
func TestBreakSignalRacingPreStopInPodThatStays(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	p := newPod(t, ns, "pod-a", nil, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", p.leads)
	p.stop() // this sidecar process ends; the next one reads the pod slowly

	gp := &gatedPods{CoreV1Interface: env.Client.CoreV1(), entered: make(chan struct{}), gate: make(chan struct{})}
	c, err := sidecar.New(sidecar.Options{Token: testToken, Settings: p.settings, Leases: env.Client.CoordinationV1(), Pods: gp,
		Metrics: sidecar.NewMetrics(prometheus.NewRegistry()), Logger: testr.New(t).WithName("pod-a/2")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx)
	t.Cleanup(func() { cancel(); c.Wait() })
	kubetest.WaitFor(t, 10*time.Second, "the second sidecar to lead", func() bool {
		st := c.Status()
		return len(st.Leases) == 1 && st.Leases[0].Leader
	})
	// Let the watch sync, so Signal's read is watch + one GET.
	time.Sleep(time.Second)

	gp.armed.Store(true)
	type res struct {
		rep *protocol.Report
		err error
	}
	sig := make(chan res, 1)
	go func() { r, err := c.Signal(context.Background()); sig <- res{r, err} }()
	<-gp.entered // Signal saw phase Running and is reading the pod
	pre := make(chan res, 1)
	go func() { r, err := c.Shutdown(context.Background(), prestop.TriggerPreStop); pre <- res{r, err} }()
	// Started, or already over: with nothing to drain it can end (and
	// wait to re-arm) within a few ms, between two polls.
	kubetest.WaitFor(t, 5*time.Second, "the preStop's sequence to start", func() bool {
		ph := c.Status().Phase
		return ph == sidecar.PhaseShuttingDown || ph == sidecar.PhaseRearming
	})
	close(gp.gate)
	s := <-sig
	r := <-pre
	if r.err != nil {
		t.Fatal(r.err)
	}
	if errors.Is(s.err, sidecar.ErrSidecarRestart) {
		t.Errorf("Signal returned ErrSidecarRestart while the preStop's sequence ran: the sidecar would exit mid-sequence")
	}
	if len(r.rep.Leases) != 1 || !r.rep.Leases[0].Released || len(r.rep.Errors) != 0 {
		t.Errorf("preStop's sequence: leases %+v, errors %q; want the Lease released, no errors", r.rep.Leases, r.rep.Errors)
	}
}

// A sequence whose stop-claiming the app refused (500) in a pod that stays:
// the old worker process never stopped claiming, and it still answers the
// app API with stopping:false until the kubelet's SIGTERM, which comes after
// the hook returns. The re-arm takes that old process for the new one: it
// rejoins the elections and grants the Lease to the process being killed,
// and the sidecar then holds the Lease through the worker's restart (its
// back-off can be minutes) with no one doing the leader work. A re-arm
// should wait for evidence of a new process (the old one seen gone, or a
// process identity in the drain status), not only stopping:false.
func TestBreakRearmTakesOldProcessAfterFailedStopClaiming(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	p := startPod(t, env.Pod(t, ns, "pod-a", 4), nil, worker.Options{}, nil)
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", p.leads)
	inner := *p.app.Load()
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == protocol.StopClaimingPath {
			http.Error(w, "busy", http.StatusInternalServerError)
			return
		}
		inner.ServeHTTP(w, r)
	})
	p.app.Store(&h)

	rep, err := p.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sequence: outcome %s, errors %q", rep.Outcome, rep.Errors)
	// No new worker process was started: the one answering is the old one.
	time.Sleep(2 * time.Second)
	if p.c.Ready() == nil {
		t.Errorf("re-armed with no new worker process: phase %s; the old process that is about to be killed leads again: %t",
			p.c.Status().Phase, p.leads())
	}
}

// A re-arm while the last round's Lease is still held by this pod (its
// release was withheld: the old process never acknowledged the revoke before
// the deadline) takes the Lease back under the same holder identity without
// a transition, so the new worker process is granted the very fencing token
// the old process held. A write of the old process still in flight is then
// indistinguishable, by its token, from the new process's.
func TestBreakRearmReusesFencingTokenOfOldProcess(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	p := startPod(t, env.Pod(t, ns, "pod-a", 2), nil, worker.Options{}, nil)
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", p.leads)
	old, _ := p.calls.lastGrant()
	inner := *p.app.Load()
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			body, _ := io.ReadAll(r.Body)
			var l protocol.Leadership
			if json.Unmarshal(body, &l) == nil && !l.Leader {
				<-r.Context().Done() // the old process never acknowledges the revoke
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		inner.ServeHTTP(w, r)
	})
	p.app.Store(&h)

	rep, err := p.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sequence: outcome %s, leases %+v, errors %q", rep.Outcome, rep.Leases, rep.Errors)
	p.restartApp(t, worker.Options{}) // the kubelet starts a new worker process
	kubetest.WaitFor(t, 10*time.Second, "the new process to lead", p.leads)
	g, _ := p.calls.lastGrant()
	if g.FencingToken == old.FencingToken {
		t.Errorf("the new worker process was granted fencing token %d, the old process's: want a higher one", g.FencingToken)
	}
}

// hangingPods is a pods client whose every call waits until its context
// ends: an apiserver that accepts connections and never answers.
type hangingPods struct{ typedcorev1.CoreV1Interface }

func (h hangingPods) Pods(ns string) typedcorev1.PodInterface {
	return hangingPodIf{PodInterface: h.CoreV1Interface.Pods(ns)}
}

type hangingPodIf struct{ typedcorev1.PodInterface }

func (hangingPodIf) Get(ctx context.Context, _ string, _ metav1.GetOptions) (*corev1.Pod, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (hangingPodIf) Watch(ctx context.Context, _ metav1.ListOptions) (watch.Interface, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (hangingPodIf) List(ctx context.Context, _ metav1.ListOptions) (*corev1.PodList, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// During a re-arm the worker answers the app API badly (500s, garbage JSON,
// hangs): the sidecar neither re-arms nor piles up goroutines; it re-arms
// once a proper new process answers. With the pod's reads hanging (watch
// never synced, GETs unanswered) every sequence still ends, from the grace
// period setting.
func TestBreakRearmBadAnswersAndHangingPodReads(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	p := newPod(t, ns, "pod-a", nil, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", p.leads)
	p.stop()
	c, err := sidecar.New(sidecar.Options{Token: testToken, Settings: p.settings, Leases: env.Client.CoordinationV1(),
		Pods: hangingPods{env.Client.CoreV1()}, Metrics: sidecar.NewMetrics(prometheus.NewRegistry()),
		Logger: testr.New(t).WithName("pod-a/2")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx)
	t.Cleanup(func() { cancel(); c.Wait() })
	kubetest.WaitFor(t, 10*time.Second, "the second sidecar to lead", func() bool {
		st := c.Status()
		return len(st.Leases) == 1 && st.Leases[0].Leader
	})
	start := time.Now()
	rep, err := c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sequence with the pod unreadable: %s, deadline from %s, took %s, errors %q",
		rep.Outcome, rep.DeadlineSource, time.Since(start), rep.Errors)
	if rep.DeadlineSource != prestop.SourceGracePeriod || !rep.Leases[0].Released {
		t.Errorf("report %+v: want the deadline from the grace period and the Lease released", rep)
	}
	kubetest.WaitFor(t, 10*time.Second, "re-arming", func() bool { return c.Status().Phase == sidecar.PhaseRearming })

	base := runtime.NumGoroutine()
	for name, h := range map[string]http.HandlerFunc{
		"500":     func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "boom", http.StatusInternalServerError) },
		"garbage": func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("{not json")) },
		"hang":    func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() },
		"stopping": func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"stopping":true,"drained":true}`))
		},
	} {
		var hh http.Handler = h
		p.app.Store(&hh)
		n := p.calls.count(protocol.DrainPath)
		kubetest.WaitFor(t, 10*time.Second, name+": 4 polls", func() bool { return p.calls.count(protocol.DrainPath) >= n+4 })
		if ph := c.Status().Phase; ph != sidecar.PhaseRearming {
			t.Errorf("%s: phase %s, want Rearming", name, ph)
		}
	}
	if g := runtime.NumGoroutine(); g > base+20 {
		t.Errorf("goroutines %d after the bad answers, %d before", g, base)
	}
	p.restartApp(t, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "re-arm for the new process", func() bool { return c.Ready() == nil })

	// SIGTERM with the pod unreadable: the sidecar cannot tell a restart of
	// its own container from a deletion, so it runs the sequence.
	start = time.Now()
	rep, err = c.Signal(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Signal with the pod unreadable: %s, trigger %s, took %s", rep.Outcome, rep.Trigger, time.Since(start))
	if ph := c.Status().Phase; ph != sidecar.PhaseDone {
		t.Errorf("phase %s after Signal, want Done", ph)
	}
}

// Many preStops at once during a re-arm (the old process still answering,
// stopping) run one sequence, whose report every caller gets; the pod stays,
// so the sidecar re-arms again and a proper new process is led.
func TestBreakConcurrentPreStopsWhileRearming(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	p := newPod(t, ns, "pod-a", nil, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", p.leads)
	first, err := p.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	const n = 16
	reps := make(chan *protocol.Report, n)
	for range n {
		go func() {
			r, err := p.c.Shutdown(context.Background(), prestop.TriggerPreStop)
			if err != nil {
				t.Error(err)
			}
			reps <- r
		}()
	}
	var got *protocol.Report
	for range n {
		r := <-reps
		if got == nil {
			got = r
		}
		if r == nil || !r.Started.Equal(got.Started) {
			t.Fatalf("reports differ: %v and %v", r, got)
		}
	}
	if !got.Started.After(first.Finished) {
		t.Errorf("the concurrent preStops got the first report back")
	}
	if len(got.Leases) != 1 || got.Leases[0].WasLeader {
		t.Errorf("second sequence leases %+v: want not leader (never armed)", got.Leases)
	}
	if ph := p.c.Status().Phase; ph != sidecar.PhaseRearming {
		t.Errorf("phase %s, want Rearming", ph)
	}
	p.restartApp(t, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "the new process to lead", p.leads)
}

// SIGTERM to the sidecar with the pod's reads hanging (an apiserver that
// does not answer): Signal first reads the pod for up to the pod read
// timeout (2 s) to tell a restart of its container from a deletion, and
// only then starts the sequence, whose deadline (grace period less margin)
// counts from that later start. The deadline then lies up to 2 s past the
// kubelet's: with the default deadline-margin of 2 s, at the SIGKILL. The
// deadline should count from the SIGTERM, and stop-claiming should not wait
// for the read.
func TestBreakSignalDeadlineShiftedByPodRead(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	p := newPod(t, ns, "pod-a", nil, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", p.leads)
	p.stop()
	c, err := sidecar.New(sidecar.Options{Token: testToken, Settings: p.settings, Leases: env.Client.CoordinationV1(),
		Pods: hangingPods{env.Client.CoreV1()}, Metrics: sidecar.NewMetrics(prometheus.NewRegistry()),
		Logger: testr.New(t).WithName("pod-a/2")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx)
	t.Cleanup(func() { cancel(); c.Wait() })
	kubetest.WaitFor(t, 10*time.Second, "the second sidecar to lead", func() bool {
		st := c.Status()
		return len(st.Leases) == 1 && st.Leases[0].Leader
	})
	sigterm := time.Now()
	rep, err := c.Signal(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := sigterm.Add(p.settings.GracePeriod - p.settings.DeadlineMargin)
	if late := rep.Deadline.Sub(want); late > 500*time.Millisecond {
		t.Errorf("deadline %s is %s after SIGTERM + grace period - margin (%s); sequence started %s after the SIGTERM",
			rep.Deadline.Format(time.RFC3339Nano), late, want.Format(time.RFC3339Nano), rep.Started.Sub(sigterm))
	}
}

// One failed stop-claiming call (here a 500 once; in practice a timeout of
// its 1 s bound under CPU throttling, or a reset connection) is never
// retried: the drain then polls a worker that goes on claiming until the
// drain deadline, the fallback runs, and the sequence ends with the worker
// never told to stop claiming, though its app answers every later call.
// The drain status says stopping:false all along; the sequence should ask
// again.
func TestBreakStopClaimingNotRetried(t *testing.T) {
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

// A process that reaches the control and app sockets but cannot sign with
// the pod's token (no header, a bearer token, another token's signature):
// its POST /v1/prestop is answered 401 with a JSON error and starts
// nothing: the sidecar keeps running, the app is never told to stop
// claiming, the Lease stays held. Its calls to the app are answered 401
// too, and the app's term and claiming are unchanged. Every call the
// sidecar itself makes to the app is signed. Then the hook, signing with
// the token, hands over.
func TestBreakNeighbourWithoutASignature(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	p := startPod(t, env.Pod(t, ns, "pod-a", 30), nil, worker.Options{}, nil)
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", p.leads)
	inner := *p.app.Load()
	var unsigned atomic.Int32
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !strings.HasPrefix(req.Header.Get("Authorization"), protocol.AuthScheme+" ") || req.Header.Get(protocol.NonceHeader) == "" {
			unsigned.Add(1)
		}
		inner.ServeHTTP(w, req)
	})
	p.app.Store(&h)
	control, _ := sockettest.Serve(t, "control.sock", p.c.ControlHandler())

	lead, _ := p.agent.Leader(lease)
	later := strconv.FormatInt(time.Now().Add(protocol.MaxSequenceAhead/2).UnixNano(), 10)
	other := strings.Repeat("a", 64)
	for _, sg := range []struct {
		what string
		sign func(r *http.Request, body string)
	}{
		{"no Authorization", func(*http.Request, string) {}},
		{"the token as a bearer token", func(r *http.Request, _ string) { r.Header.Set("Authorization", "Bearer "+testToken) }},
		{"another token's signature", func(r *http.Request, body string) { protocol.Sign(r, other, []byte(body), time.Now()) }},
	} {
		for _, c := range []struct {
			to           protocol.Endpoint
			method, path string
			body         string
		}{
			{control, http.MethodPost, protocol.PreStopPath, ``},
			{control, http.MethodGet, protocol.StatusPath, ``},
			{p.appAddr, http.MethodPost, protocol.StopClaimingPath, `{}`},
			{p.appAddr, http.MethodPut, protocol.LeasePathPrefix + lease, `{"leader":false,"sequence":` + later + `}`},
			{p.appAddr, http.MethodPut, protocol.LeasePathPrefix + lease, `{"leader":true,"fencingToken":99,"validForMillis":2000,"sequence":` + later + `}`},
		} {
			req, _ := http.NewRequest(c.method, c.to.URL()+c.path, strings.NewReader(c.body))
			sg.sign(req, c.body)
			resp, err := (&http.Client{Transport: c.to.Transport(0, 0)}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var e struct{ Error string }
			derr := json.NewDecoder(resp.Body).Decode(&e)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || derr != nil || e.Error == "" {
				t.Errorf("%s, %s %s %s: %s (%v); want 401 with a JSON error", sg.what, c.method, c.to, c.path, resp.Status, derr)
			}
		}
	}
	if st := p.c.Status(); st.Phase != protocol.PhaseRunning || st.Report != nil {
		t.Errorf("after the neighbour's preStop: phase %s, report %v; want Running and no sequence", st.Phase, st.Report)
	}
	select {
	case <-p.agent.Stopping():
		t.Error("the neighbour's calls stopped the app's claiming")
	default:
	}
	if now, ok := p.agent.Leader(lease); !ok || now.FencingToken != lead.FencingToken {
		t.Errorf("after the neighbour's calls: Leader = %+v, %v; want the sidecar's term, fencing token %d", now, ok, lead.FencingToken)
	}
	n := unsigned.Load() // the neighbour's own calls to the app
	rep, err := prestop.Call(context.Background(), control, testToken, time.Second)
	if err != nil || rep.Outcome != protocol.OutcomeDrained || len(rep.Errors) > 0 || len(rep.Leases) != 1 || !rep.Leases[0].Released {
		t.Fatalf("the hook, signing with the token: %+v, %v; want Drained, the Lease released", rep, err)
	}
	if got := unsigned.Load() - n; got != 0 || n != 6 {
		t.Errorf("%d of the sidecar's calls to the app were not signed (the neighbour's unsigned: %d of 6); want none", got, n)
	}
}
