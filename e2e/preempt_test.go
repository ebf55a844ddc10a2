//go:build e2e

package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// preemptSlot is an extended resource the test gives the node two of:
// each worker pod takes one, so a pod of higher priority that asks for
// one can be scheduled only by preempting a worker.
const preemptSlot = "handoff.dev/e2e-slot"

// TestPreemptionHandsOver: two workers under load, each taking one of the
// node's two slots; a pod of a higher PriorityClass asks for a slot, and the
// scheduler preempts a worker. The victim is the Lease holder: a
// PodDisruptionBudget covers the other worker alone, and the scheduler
// spares the victims whose eviction would break a budget first. A
// preemption is a graceful deletion by the scheduler (condition
// DisruptionTarget, reason PreemptionByScheduler) with the pod's grace
// period: the victim's preStop runs and handoff hands over as on any
// deletion: it drains, releases the Lease, and the other worker takes it
// at once (within the retry period, not the lease duration); the victim
// is gone within its grace period; nothing is lost or applied twice.
func TestPreemptionHandsOver(t *testing.T) {
	nodeOnly(t)
	const name, lease = "preempt", "preempt-leader"
	ctx := context.Background()
	setSlots := func(n int) {
		patch := []byte(`{"status":{"capacity":{"` + preemptSlot + `":"` + resource.NewQuantity(int64(n), resource.DecimalSI).String() + `"}}}`)
		if n == 0 {
			patch = []byte(`{"status":{"capacity":{"` + preemptSlot + `":null}}}`)
		}
		if _, err := cluster.kube.CoreV1().Nodes().Patch(ctx, "127.0.0.1", types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
	}
	setSlots(2)
	t.Cleanup(func() { setSlots(0) })
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "e2e-preemptor"}, Value: 1_000_000}
	if _, err := cluster.kube.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.kube.SchedulingV1().PriorityClasses().Delete(ctx, pc.Name, metav1.DeleteOptions{}) })

	slot := corev1.ResourceList{preemptSlot: resource.MustParse("1")}
	d := worker(name, 2, 20, "--visibility-timeout", "15s", "--batch", "1")
	d.Spec.Template.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: slot, Limits: slot}
	rec := record(t, name, lease)
	deploy(t, d)
	l := startLoad(t, name, 5, shortWork)
	holder := podOf(waitHeld(rec, 30*time.Second))
	if holder == "" {
		t.Fatalf("no pod holds Lease %s", lease)
	}
	var other string
	for _, p := range podNames(t, name) {
		if p != holder {
			other = p
		}
	}
	// The other worker under a PodDisruptionBudget of its own: the
	// scheduler then preempts the Lease holder.
	if _, err := cluster.kube.CoreV1().Pods(namespace).Patch(ctx, other, types.MergePatchType, []byte(`{"metadata":{"labels":{"e2e-spared":"true"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "preempt-spared"}, Spec: policyv1.PodDisruptionBudgetSpec{
		MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"e2e-spared": "true"}}}}
	if _, err := cluster.kube.PolicyV1().PodDisruptionBudgets(namespace).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.kube.PolicyV1().PodDisruptionBudgets(namespace).Delete(ctx, pdb.Name, metav1.DeleteOptions{})
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		b, err := cluster.kube.PolicyV1().PodDisruptionBudgets(namespace).Get(ctx, pdb.Name, metav1.GetOptions{})
		if err == nil && b.Status.ObservedGeneration >= b.Generation && b.Status.CurrentHealthy == 1 && b.Status.DisruptionsAllowed == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("PodDisruptionBudget %s not observed covering %s within 30s", pdb.Name, other)
		}
	}
	_, seen := podEvents(t, holder)

	preemptor := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "preemptor"}, Spec: corev1.PodSpec{
		PriorityClassName: pc.Name, TerminationGracePeriodSeconds: ptr.To(int64(0)),
		Containers: []corev1.Container{{Name: "pause", Image: images.pause, ImagePullPolicy: images.pullPolicy,
			Resources: corev1.ResourceRequirements{Requests: slot, Limits: slot}}},
	}}
	if _, err := cluster.kube.CoreV1().Pods(namespace).Create(ctx, preemptor, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createdAt := time.Now()
	t.Cleanup(func() {
		_ = cluster.kube.CoreV1().Pods(namespace).Delete(ctx, preemptor.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	})

	// The holder preempted: a deletion with the reason on the pod.
	var reason string
	for deadline := createdAt.Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		p := getPod(t, holder)
		if p == nil {
			t.Fatalf("pod %s gone before its preemption was seen", holder)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
				reason = c.Reason
			}
		}
		if p.DeletionTimestamp != nil && reason != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s (the Lease holder) not preempted within 30s of the preemptor's creation (deleting %v, DisruptionTarget %q); pod %s deleted: %v",
				holder, p.DeletionTimestamp != nil, reason, other, getPod(t, other) == nil || getPod(t, other).DeletionTimestamp != nil)
		}
	}
	if reason != corev1.PodReasonPreemptionByScheduler {
		t.Errorf("pod %s DisruptionTarget reason %q, want %s", holder, reason, corev1.PodReasonPreemptionByScheduler)
	}
	evs := waitNewEvents(t, holder, seen, 30*time.Second, "DrainStarted", "Drained", "LeaseReleased")
	t.Logf("the preemption of %s:\n%s", holder, describeEvents(evs))
	took := waitGone(t, holder, createdAt, 25*time.Second)
	if h := podOf(waitHeld(rec, 10*time.Second)); h != other {
		t.Errorf("after the preemption Lease %s is held by %q, want the other worker %s", lease, h, other)
	}
	// Handed over, not left to expire: the Lease seen free (released by
	// the victim) before the other worker took it.
	rec.mu.Lock()
	deleted := rec.pods[holder].terminating
	var freed, taken time.Time
	for _, o := range rec.holders {
		switch {
		case !o.at.After(deleted) || !taken.IsZero():
		case o.holder == "" && freed.IsZero():
			freed = o.at
		case podOf(o.holder) == other:
			taken = o.at
		}
	}
	rec.mu.Unlock()
	t.Logf("%s preempted (DisruptionTarget %s): gone %s after the preemptor's creation; Lease %s seen released %s and taken by %s %s after the deletion was seen",
		holder, reason, took.Round(time.Millisecond), lease, freed.Sub(deleted).Round(time.Millisecond), other, taken.Sub(deleted).Round(time.Millisecond))
	if freed.IsZero() || taken.Before(freed) {
		t.Errorf("Lease %s not seen released by %s before %s took it (released at %v, taken at %v): it was left to expire", lease, holder, other, freed, taken)
	}
	if p := getPod(t, preemptor.Name); p == nil || p.Spec.NodeName == "" {
		t.Errorf("the preemptor was not scheduled once %s was gone", holder)
	}
	if pods := podNames(t, name); !slices.Contains(pods, other) {
		t.Errorf("the spared worker %s is gone too: pods %v", other, pods)
	}
	l.end()
	checkQueue(t, time.Minute)
	rec.checkTerms(t, lease)
}
