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
