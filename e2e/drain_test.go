//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
)

// A worker whose work outlasts the grace period given at deletion (kubectl
// delete pod --grace-period=6): the sequence follows that deadline, hands
// the unfinished claims back, releases the Lease, and the pod is gone
// within its grace period; a survivor finishes the work, once. In the
// legacy layout the sidecar is a plain container: its own preStop keeps it
// up until the handover is over.
func TestShortGracePeriodReturnsUnfinishedClaims(t *testing.T) {
	for _, layout := range []string{"native", "legacy"} {
		t.Run(layout, func(t *testing.T) { shortGracePeriod(t, layout) })
	}
}

func shortGracePeriod(t *testing.T, layout string) {
	ctx := context.Background()
	deploy(t, worker("slow-"+layout, 2, 30, "handoff.dev/layout", layout))
	msgs := []queue.Message{
		{DedupKey: layout + "-1", Amount: 1, WorkMillis: 15000}, {DedupKey: layout + "-2", Amount: 2, WorkMillis: 15000},
		{DedupKey: layout + "-3", Amount: 3, WorkMillis: 15000}, {DedupKey: layout + "-4", Amount: 4, WorkMillis: 15000},
	}
	if err := queue.Enqueue(ctx, cluster.pool, msgs); err != nil {
		t.Fatal(err)
	}
	// The pod with the most claims leaves.
	var victim string
	var claims int
	for deadline := time.Now().Add(30 * time.Second); claims == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no worker claimed the slow messages")
		}
		_ = cluster.pool.QueryRow(ctx, `SELECT claimed_by, count(*) FROM handoff_queue WHERE claimed_by IS NOT NULL
			GROUP BY claimed_by ORDER BY count(*) DESC LIMIT 1`).Scan(&victim, &claims)
	}
	deleted := time.Now()
	if err := cluster.kube.CoreV1().Pods(namespace).Delete(ctx, victim, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](6)}); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := cluster.kube.CoreV1().Pods(namespace).Get(ctx, victim, metav1.GetOptions{})
		if err != nil {
			break
		}
		if time.Since(deleted) > 15*time.Second {
			t.Fatalf("pod %s still there %s after a delete with a 6s grace period", victim, time.Since(deleted))
		}
		time.Sleep(100 * time.Millisecond)
	}
	gone := time.Since(deleted)
	t.Logf("pod %s with %d claims gone %s after the delete (grace period 6s)", victim, claims, gone.Round(time.Millisecond))
	if gone > 6*time.Second+2*time.Second {
		t.Errorf("pod took %s to go, more than its 6s grace period (and 2s for the kubelet's bookkeeping)", gone)
	}

	events, err := cluster.kube.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + victim})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, e := range events.Items {
		seen = append(seen, e.Reason+": "+e.Message)
	}
	all := strings.Join(seen, "\n")
	for _, want := range []string{"DrainDeadlineExceeded: Drain deadline exceeded with", "fallback return: ", "LeaseReleased", "DrainStarted"} {
		if want == "LeaseReleased" && !strings.Contains(all, "LeaseAcquired") {
			continue // this pod never held the Lease
		}
		if !strings.Contains(all, want) {
			t.Errorf("no %q among the pod's Events:\n%s", want, all)
		}
	}

	// The survivor finishes the returned work, each message once.
	var rep queue.Report
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if rep, err = queue.Check(ctx, cluster.pool); err != nil {
			t.Fatal(err)
		}
		if rep.Pending == 0 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("queue: %s", rep)
	if err := rep.Err(); err != nil || rep.Pending != 0 {
		t.Errorf("after the handover: %v, %d pending", err, rep.Pending)
	}
}
