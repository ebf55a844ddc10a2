package sidecar_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
)

// coordinating returns the pod's condition protocol.PodConditionCoordinating
// as "reason/status", or "" without one.
func coordinating(t *testing.T, ns, name string) string {
	t.Helper()
	p, err := kubetest.Get(t).Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == protocol.PodConditionCoordinating {
			return c.Reason + "/" + string(c.Status)
		}
	}
	return ""
}

// The sidecar writes its phase on its own pod's status, where handoff
// status reads it: Running (True) once its elections run, Done (False)
// once its last sequence is over; the pod's other conditions stay.
func TestPhaseIsWrittenOnThePod(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	obj := env.Pod(t, ns, "pod-a", 30)
	obj.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if _, err := env.Client.CoreV1().Pods(ns).UpdateStatus(context.Background(), obj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	a := startPod(t, obj, nil, worker.Options{}, nil)
	kubetest.WaitFor(t, 10*time.Second, "the condition Running/True on the pod", func() bool {
		return coordinating(t, ns, "pod-a") == "Running/True"
	})
	// The pod is deleted; the sequence runs and ends.
	if err := env.Client.CoreV1().Pods(ns).Delete(context.Background(), "pod-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop); err != nil {
		t.Fatal(err)
	}
	if !a.c.WaitPhaseWritten(5 * time.Second) {
		t.Fatal("the phase Done not written on the pod within 5s")
	}
	if got := coordinating(t, ns, "pod-a"); got != "Done/False" {
		t.Errorf("after the sequence: condition %s = %q, want Done/False", protocol.PodConditionCoordinating, got)
	}
	p, err := env.Client.CoreV1().Pods(ns).Get(context.Background(), "pod-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
			t.Errorf("the pod's Ready condition changed to %s", c.Status)
		}
	}
}
