package sidecar_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"runtime"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/watch"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/sidecar"
	"github.com/handoff-dev/handoff/worker"
)

// A preStop in a pod that is not being deleted is the kubelet killing the
// worker container for a restart (a liveness or startup probe failure). The
// sidecar hands over, then re-arms once a new worker process is up: it
// rejoins the election, tells the new process about leadership, and the
// next preStop runs a new sequence with its own report. A deletion does not
// re-arm.
func TestWorkerRestartRearms(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	a, b := leaderAndStandby(t, ns, nil, worker.Options{})
	if err := a.c.Ready(); err != nil {
		t.Fatalf("ready before any sequence: %v", err)
	}
	if g := value(t, a.metrics.Coordinating); g != 1 {
		t.Errorf("handoff_coordinating = %v while the elections run, want 1", g)
	}

	// The liveness kill: preStop with no deletionTimestamp.
	first, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	if first.Outcome != protocol.OutcomeDrained || first.DeadlineSource != prestop.SourceGracePeriod || !first.Leases[0].Released {
		t.Fatalf("first sequence: outcome %s, deadline from %s, leases %+v: want Drained, from the grace period, released",
			first.Outcome, first.DeadlineSource, first.Leases)
	}
	if st := a.c.Status(); st.Phase != sidecar.PhaseRearming || st.Report == nil || !st.Report.Started.Equal(first.Started) {
		t.Errorf("after the sequence: phase %s, report %v; want Rearming with the sequence's report", st.Phase, st.Report)
	}
	if a.c.Ready() == nil {
		t.Error("ready while the elections are stopped")
	}
	if g := value(t, a.metrics.Coordinating); g != 0 {
		t.Errorf("handoff_coordinating = %v while not re-armed, want 0", g)
	}
	kubetest.WaitFor(t, 5*time.Second, "b's app to lead", b.leads)

	// The old process still answers, stopping: no re-arm for it.
	polled := a.calls.count(protocol.DrainPath)
	kubetest.WaitFor(t, 5*time.Second, "the sidecar to poll the old process twice", func() bool {
		return a.calls.count(protocol.DrainPath) >= polled+2
	})
	if ph := a.c.Status().Phase; ph != sidecar.PhaseRearming {
		t.Fatalf("phase %s while the old, stopping process answers; want Rearming", ph)
	}

	// The kubelet starts a new worker process: the sidecar re-arms.
	a.restartApp(t, worker.Options{})
	kubetest.WaitFor(t, 5*time.Second, "a to re-arm", func() bool { return a.c.Ready() == nil })
	if ph := a.c.Status().Phase; ph != sidecar.PhaseRunning {
		t.Errorf("phase %s after re-arming, want Running", ph)
	}
	if n := value(t, a.metrics.Rearms); n != 1 {
		t.Errorf("handoff_rearms_total = %v, want 1", n)
	}
	events(t, ns, "pod-a", sidecar.ReasonRearmed)

	// b leaves (deleted): the Lease comes back to a, and a's new process is told.
	if err := env.Client.CoreV1().Pods(ns).Delete(context.Background(), "pod-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.Shutdown(context.Background(), prestop.TriggerPreStop); err != nil {
		t.Fatal(err)
	}
	kubetest.WaitFor(t, 5*time.Second, "a's new process to lead", a.leads)

	// The next kill runs a new sequence, with its own report.
	second, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	if !second.Started.After(first.Finished) {
		t.Errorf("second report started %s, not after the first finished %s: want a new sequence", second.Started, first.Finished)
	}
	if len(second.Leases) != 1 || !second.Leases[0].WasLeader || !second.Leases[0].Released {
		t.Errorf("second sequence leases %+v, want the Lease held and released", second.Leases)
	}
	if _, _, err := a.agent.Begin(context.Background()); err == nil {
		t.Error("the new process was not told to stop claiming by the second sequence")
	}

	// A deletion: the sequence hands over and the sidecar stays done.
	a.restartApp(t, worker.Options{})
	kubetest.WaitFor(t, 5*time.Second, "a to re-arm again", func() bool { return a.c.Ready() == nil })
	if err := env.Client.CoreV1().Pods(ns).Delete(context.Background(), "pod-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	third, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	if third.DeadlineSource != prestop.SourceDeletionTimestamp || !third.Started.After(second.Finished) {
		t.Errorf("third sequence: deadline from %s, started %s: want a new one from the deletionTimestamp", third.DeadlineSource, third.Started)
	}
	if ph := a.c.Status().Phase; ph != sidecar.PhaseDone {
		t.Errorf("phase %s after a sequence in a pod being deleted, want Done", ph)
	}
	again, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Started.Equal(third.Started) {
		t.Errorf("a trigger after the deletion's sequence got a report started %s, want the same %s", again.Started, third.Started)
	}
}

// value is a gauge's or counter's current value.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Gauge != nil {
		return d.Gauge.GetValue()
	}
	return d.Counter.GetValue()
}

// A liveness probe kill gets the probe's terminationGracePeriodSeconds,
// read from the pod's own object through the watch, not the pod's.
func TestProbeKillDeadlineIsTheProbesGracePeriod(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	obj, err := env.Client.CoreV1().Pods(ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pod-a"},
		Spec: corev1.PodSpec{
			NodeName:                      "node-1",
			TerminationGracePeriodSeconds: ptr.To[int64](30),
			Containers: []corev1.Container{{Name: "worker", Image: "worker", LivenessProbe: &corev1.Probe{
				ProbeHandler:                  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
				TerminationGracePeriodSeconds: ptr.To[int64](6),
			}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a := startPod(t, obj, map[string]string{"leases": "", "worker-container": "worker"}, worker.Options{}, nil)
	rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
	if err != nil {
		t.Fatal(err)
	}
	want := rep.Started.Add(6*time.Second - a.settings.DeadlineMargin)
	if rep.DeadlineSource != prestop.SourceProbeGracePeriod || !rep.Deadline.Equal(want) {
		t.Errorf("deadline started+%s from %s, want started+%s from %s", rep.Deadline.Sub(rep.Started), rep.DeadlineSource,
			want.Sub(rep.Started), prestop.SourceProbeGracePeriod)
	}
	if ph := a.c.Status().Phase; ph != sidecar.PhaseRearming {
		t.Errorf("phase %s after a probe kill, want Rearming", ph)
	}
}

// A sequence whose stop-claiming the app refused (500) in a pod that stays:
// the old worker process never stopped claiming, and it still answers the
// app API with stopping:false until the kubelet's SIGTERM, which comes after
// the hook returns. The sidecar does not re-arm for it: it waits for
// evidence of a new process (the old one seen gone, or another process
// identity in the drain status), not only stopping:false. Re-armed for the
// old process, it would grant the Lease to the process being killed and
// hold it through the worker's restart (its back-off can be minutes) with
// no one doing the leader work.
func TestRearmWaitsForANewProcessAfterAFailedStopClaiming(t *testing.T) {
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
// the deadline) grants the new worker process a higher fencing token than
// the old process held, so that a write of the old process still in flight
// is told apart, by its token, from the new process's.
func TestRearmGrantsTheNewProcessAHigherFencingToken(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	p := startPod(t, env.Pod(t, ns, "pod-a", 2), nil, worker.Options{}, nil)
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", p.leads)
	old, _ := p.calls.lastGrant()
	p.neverAcknowledgeRevokes()

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

// restartedWithHangingPodReads starts pod-a, waits until its app leads,
// ends its sidecar process, and starts the next one (pod-a/2), whose pod
// reads hang (hangingPods), and waits until that one leads: a sidecar
// restarted while the apiserver stops answering its pod reads.
func restartedWithHangingPodReads(t *testing.T, env *kubetest.Env, ns string) (*pod, *sidecar.Coordinator) {
	t.Helper()
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
	return p, c
}

// neverAcknowledgeRevokes makes p's worker process hold every revoke (a
// PUT of a Leadership with leader false) unanswered until the caller gives
// up, as a worker stuck in its leader work would; other calls are served.
func (p *pod) neverAcknowledgeRevokes() {
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
func TestRearmWaitsOutBadAnswersAndHangingPodReads(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	p, c := restartedWithHangingPodReads(t, env, ns)
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
func TestConcurrentPreStopsWhileRearmingRunOneSequence(t *testing.T) {
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
