package sidecar_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/sidecar"
	"github.com/handoff-dev/handoff/worker"
)

// Deleting the pod starts the sequence with no hook call; the hook then
// joins it and gets its report; the deadline is the deletion's.
func TestDeletionStartsTheSequenceAndTheHookJoinsIt(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	a, b := leaderAndStandby(t, ns, map[string]string{"role-leases": lease}, worker.Options{})
	_, finish, err := a.agent.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	grace := int64(20)
	if err := env.Client.CoreV1().Pods(ns).Delete(context.Background(), "pod-a", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	// No hook yet: the watch of the pod's own object starts the sequence.
	kubetest.WaitFor(t, 5*time.Second, "pod-a's app to be told to stop claiming", func() bool {
		select {
		case <-a.agent.Stopping():
			return true
		default:
			return false
		}
	})
	kubetest.WaitFor(t, 5*time.Second, "pod-b's app to lead the role Lease", b.leads)
	if st := a.c.Status(); st.Phase != sidecar.PhaseShuttingDown {
		t.Errorf("phase %s during the drain, want %s", st.Phase, sidecar.PhaseShuttingDown)
	}

	hooked := time.Now()
	reports := make(chan *protocol.Report, 1)
	go func() {
		rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
		if err != nil {
			t.Error(err)
		}
		reports <- rep
	}()
	finish()
	rep := <-reports
	if rep == nil {
		t.FailNow()
	}
	if rep.Trigger != protocol.TriggerDeletion || !rep.Started.Before(hooked) {
		t.Errorf("the hook got a report triggered by %s at %s (hook at %s); want the deletion's sequence, started before the hook", rep.Trigger, rep.Started, hooked)
	}
	if n := a.calls.count(protocol.StopClaimingPath); n != 1 {
		t.Errorf("stop-claiming called %d times, want 1: the hook joins the sequence", n)
	}
	p, err := env.Client.CoreV1().Pods(ns).Get(context.Background(), "pod-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := p.DeletionTimestamp.Add(-a.settings.DeadlineMargin); rep.DeadlineSource != prestop.SourceDeletionTimestamp || !rep.Deadline.Equal(want) {
		t.Errorf("deadline %s from %s, want %s from the deletionTimestamp", rep.Deadline, rep.DeadlineSource, want)
	}
}

// A sidecar that starts in a pod already being deleted (a restarted
// sidecar process) starts no sequence from that deletion: it coordinates
// until a trigger comes.
func TestOldDeletionStartsNoSequence(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	obj := env.Pod(t, ns, "pod-a", 30)
	if err := env.Client.CoreV1().Pods(ns).Delete(context.Background(), "pod-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	a := startPod(t, obj, nil, worker.Options{}, nil)
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead", a.leads)
	// Another update of the pod, seen by the watch: still no sequence.
	patch := []byte(`{"metadata":{"labels":{"seen":"yes"}}}`)
	if _, err := env.Client.CoreV1().Pods(ns).Patch(context.Background(), "pod-a", "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	kubetest.WaitFor(t, 5*time.Second, "a lease renewal after the update", func() bool { return a.calls.grantsSince(time.Now().Add(-100*time.Millisecond)) > 0 })
	if st := a.c.Status(); st.Phase != sidecar.PhaseRunning || a.calls.count(protocol.StopClaimingPath) != 0 {
		t.Errorf("phase %s, stop-claiming called %d times: want Running, none, as no trigger came", st.Phase, a.calls.count(protocol.StopClaimingPath))
	}
}
