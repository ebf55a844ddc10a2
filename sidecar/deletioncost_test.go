package sidecar_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
)

// deletionCost returns the pod's pod-deletion-cost annotation, and whether
// it has one.
func deletionCost(t *testing.T, ns, name string) (string, bool) {
	t.Helper()
	p, err := kubetest.Get(t).Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, ok := p.Annotations[corev1.PodDeletionCost]
	return v, ok
}

// With deletion-cost on, the sidecar writes its pod's pod-deletion-cost
// on the real API server as its pod becomes dearer: the role Lease taken,
// then work in progress; the pod's other annotations and its status stay.
// A pod whose sidecar has the setting off gets none, and so does a pod
// without the opt-in annotation though its sidecar has the setting on (the
// chart's policy would refuse every write).
func TestDeletionCostFollowsWhatThePodHolds(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	obj := env.Pod(t, ns, "pod-a", 30)
	obj.Annotations = map[string]string{"team": "orders", protocol.DeletionCostOptIn: "true"}
	if _, err := env.Client.CoreV1().Pods(ns).Update(context.Background(), obj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	a := startPod(t, obj, map[string]string{"role-leases": lease, "deletion-cost": "true"}, worker.Options{}, nil)
	startPod(t, env.Pod(t, ns, "pod-b", 30), map[string]string{"leases": "", "deletion-cost": "false"}, worker.Options{}, nil)
	startPod(t, env.Pod(t, ns, "pod-c", 30), map[string]string{"leases": "", "deletion-cost": "true"}, worker.Options{}, nil)

	kubetest.WaitFor(t, 15*time.Second, "pod-a's deletion cost 10000 (the role Lease held, no work)", func() bool {
		v, _ := deletionCost(t, ns, "pod-a")
		return v == "10000"
	})
	r, err := a.agent.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c := r.Hold()
	r.End()
	defer c.Done()
	kubetest.WaitFor(t, 15*time.Second, "pod-a's deletion cost 10010 (the role Lease and work in progress)", func() bool {
		v, _ := deletionCost(t, ns, "pod-a")
		return v == "10010"
	})
	p, err := env.Client.CoreV1().Pods(ns).Get(context.Background(), "pod-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Annotations["team"] != "orders" {
		t.Errorf("pod-a's annotation team = %q after the sidecar's writes, want orders", p.Annotations["team"])
	}
	// pod-b's and pod-c's sidecars polled as often as pod-a's, and wrote
	// nothing.
	if v, ok := deletionCost(t, ns, "pod-b"); ok {
		t.Errorf("pod-b (deletion-cost false) has %s=%q, want none", corev1.PodDeletionCost, v)
	}
	if v, ok := deletionCost(t, ns, "pod-c"); ok {
		t.Errorf("pod-c (deletion-cost true, not annotated %s) has %s=%q, want none", protocol.DeletionCostOptIn, corev1.PodDeletionCost, v)
	}

}
