//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestRestartAllContainersResumes: a worker container whose
// restartPolicyRules restart all of the pod's containers in place when it
// exits with code 3 (KEP-5532, action RestartAllContainers: beta since
// Kubernetes 1.36; e2e/cluster turns its alpha gate on for 1.35). The
// Lease holder's worker crashes with code 3 (no claim handed back). The
// kubelet then kills every other container of the pod, the handoff sidecar
// too, with a grace period of 0: no preStop, no SIGTERM, so there is
// nothing to hand over and the sidecar cannot release the Lease. What
// handoff promises instead: the pod is not deleted; its restarted sidecar
// (a new process, the same pod UID, so the same holder identity) takes the
// Lease back at once rather than after the lease duration, or the other pod
// takes it once its term ends, never before (leadership safety); the
// leader job runs again; the crashed worker's claims come back at their
// visibility timeout and are applied once; a later deletion of the pod
// hands over as on any deletion.
func TestRestartAllContainersResumes(t *testing.T) {
	const name, lease = "restartall", "restartall-leader"
	d := withFaults(worker(name, 2, 15, "--visibility-timeout", "10s", "--concurrency", "2", "--batch", "1"), false)
	c := &d.Spec.Template.Spec.Containers[0]
	c.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	c.RestartPolicyRules = []corev1.ContainerRestartRule{{
		Action:    corev1.ContainerRestartRuleActionRestartAllContainers,
		ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: corev1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{3}},
	}}
	rec := record(t, name, lease)
	deploy(t, d)
	got, err := cluster.kube.AppsV1().Deployments(namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Template.Spec.Containers[0].RestartPolicyRules) == 0 {
		t.Skip("the API server dropped the worker's restartPolicyRules: its ContainerRestartRules or RestartAllContainersOnContainerExits gate is off (alpha in 1.35: e2e/cluster/up.sh turns them on)")
	}
	waitWorkersStarted(t, name)
	l := startLoad(t, name, 5, shortWork)

	holder := podOf(waitHeld(rec, 30*time.Second))
	if holder == "" {
		t.Fatalf("no pod holds Lease %s", lease)
	}
	before := getPod(t, holder)
	sidecarID := containerStatus(before, "handoff").ContainerID
	fault(t, holder, "/fault/crash")
	crashedAt := time.Now()

	// Every container of the pod restarted in place: a new sidecar
	// container, the worker running and Ready again; the pod the same.
	for deadline := crashedAt.Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		p := getPod(t, holder)
		if p == nil || p.UID != before.UID || p.DeletionTimestamp != nil {
			t.Fatalf("pod %s deleted or replaced after its worker's exit 3", holder)
		}
		sidecar, w := containerStatus(p, "handoff"), containerStatus(p, "worker")
		if sidecar.ContainerID != "" && sidecar.ContainerID != sidecarID && sidecar.Ready && w.State.Running != nil && w.Ready {
			t.Logf("every container of %s restarted in place %s after the worker's exit 3 (sidecar %s, was %s)",
				holder, time.Since(crashedAt).Round(time.Millisecond), sidecar.ContainerID, sidecarID)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the containers of %s not all restarted and Ready within 90s of the worker's exit 3: sidecar %+v, worker %+v", holder, sidecar.State, w.State)
		}
	}

	// The Lease held again and the leader job running.
	h := waitHeld(rec, 30*time.Second)
	if h == "" {
		t.Fatalf("no pod holds Lease %s within 30s of the containers' restart", lease)
	}
	by := waitLeaderRun(t, lease, time.Now(), 15*time.Second)
	if by == "" {
		t.Errorf("Lease %s held by %s but no leader job ran within 15s", lease, h)
	}
	t.Logf("after the in-place restart: Lease %s held by %s, leader job run by %s; each change of holder:\n%s", lease, h, by, rec.changes())

	// The restarted sidecar hands over at a deletion, as any.
	_, seen := podEvents(t, holder)
	if err := deletePod(holder, nil); err != nil {
		t.Fatal(err)
	}
	evs := waitNewEvents(t, holder, seen, 30*time.Second, "DrainStarted", "Drained")
	t.Logf("the deletion of %s after its in-place restart:\n%s", holder, describeEvents(evs))
	waitGone(t, holder, time.Now(), 30*time.Second)

	l.end()
	checkQueue(t, time.Minute)
	rec.checkTerms(t, lease)
}
