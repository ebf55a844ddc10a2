//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
	"github.com/handoff-dev/handoff/internal/kubetest"
)

// A worker whose work cannot finish before its pod must be gone: the
// sequence follows the deadline, hands the unfinished claims back (the
// count is in the pod's DrainDeadlineExceeded Event), releases the Lease,
// and the pod is gone within its grace period; the survivor finishes the
// work, once.
//
//   - delete-grace-6: kubectl delete pod --grace-period=6 on a pod whose
//     spec gives 30 s: the sequence follows the shorter deadline.
//   - legacy: the same in the legacy layout, where the sidecar is a plain
//     container that the kubelet would stop at once; its own preStop keeps
//     it up until the handover is over.
//   - never-drains: a plain delete of a pod whose grace period (10 s) is
//     shorter than any of its work.
func TestDeadlineHandsBackUnfinishedClaims(t *testing.T) {
	for _, c := range []struct {
		name, layout  string
		podGrace      int64
		deleteGrace   *int64
		work, maxWork time.Duration
	}{
		{"delete-grace-6", "native", 30, ptr.To[int64](6), 15 * time.Second, 25 * time.Second},
		{"legacy", "legacy", 30, ptr.To[int64](6), 15 * time.Second, 25 * time.Second},
		{"never-drains", "native", 10, nil, 20 * time.Second, 30 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			grace := c.podGrace
			if c.deleteGrace != nil {
				grace = *c.deleteGrace
			}
			deadlineHandsBack(t, c.name, c.layout, c.podGrace, c.deleteGrace, grace, c.work, c.maxWork)
		})
	}
}

var returnedCount = regexp.MustCompile(`fallback return: (\d+) returned`)

func deadlineHandsBack(t *testing.T, name, layout string, podGrace int64, deleteGrace *int64, grace int64, work, maxWork time.Duration) {
	ctx := context.Background()
	// One message per claim: every claim held is started, so all of them
	// wait for the deadline's fallback (unstarted ones would go back at
	// stop-claiming).
	d := annotate(worker(name, 2, podGrace, "--concurrency", "8", "--batch", "1"), "handoff.dev/layout", layout)
	deploy(t, d)
	rec := record(t, name, name+"-leader")
	// 12 slow messages: each pod claims at most 8, so the Lease holder has
	// some.
	var msgs []queue.Message
	for i := range 12 {
		w := work + time.Duration(i)*(maxWork-work)/12
		msgs = append(msgs, queue.Message{DedupKey: fmt.Sprintf("%s-%d", name, i), Amount: int64(i + 1), WorkMillis: int(w.Milliseconds())})
	}
	if err := queue.Enqueue(ctx, cluster.pool, msgs); err != nil {
		t.Fatal(err)
	}
	victim, claims := waitHolderClaims(t, rec, name)
	// The webhook's count of the namespace's drain deadlines before: the
	// victim's adds one.
	deadlinesBefore := promDeadlines(t)

	deleted := time.Now()
	if err := cluster.kube.CoreV1().Pods(namespace).Delete(ctx, victim, metav1.DeleteOptions{GracePeriodSeconds: deleteGrace}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := cluster.kube.CoreV1().Pods(namespace).Get(ctx, victim, metav1.GetOptions{}); err != nil {
			break
		}
		if time.Since(deleted) > time.Duration(grace+10)*time.Second {
			t.Fatalf("pod %s still there %s after a delete with a %ds grace period", victim, time.Since(deleted), grace)
		}
		time.Sleep(100 * time.Millisecond)
	}
	gone := time.Since(deleted)
	t.Logf("Lease holder %s with %d claims gone %s after the delete (grace period %ds)", victim, claims, gone.Round(time.Millisecond), grace)
	if gone > time.Duration(grace+2)*time.Second {
		t.Errorf("pod took %s to go, more than its %ds grace period (and 2s for the kubelet's bookkeeping)", gone, grace)
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
	for _, want := range []string{"DrainStarted: ", "DrainDeadlineExceeded: Drain deadline exceeded with", "LeaseReleased: Lease " + name + "-leader (role) released"} {
		if !strings.Contains(all, want) {
			t.Errorf("no %q among the pod's Events:\n%s", want, all)
		}
	}
	if m := returnedCount.FindStringSubmatch(all); m == nil {
		t.Errorf("no count of returned claims among the pod's Events:\n%s", all)
	} else if n, _ := strconv.Atoi(m[1]); n != claims {
		t.Errorf("the Event says %d claims returned; the pod held %d", n, claims)
	}
	if h := rec.holderAt(time.Now()); podOf(h) == victim {
		t.Errorf("Lease %s-leader still names %s after its pod is gone", name, h)
	}
	// A real Prometheus scraping the webhook read the victim's deadline,
	// counted from its ShutdownFinished Event (the sidecar did not stay for
	// a scrape), and the chart's alert fires.
	if prom != "" {
		kubetest.WaitFor(t, 10*promInterval, "Prometheus to read "+victim+"'s drain-deadline step from the webhook", func() bool {
			// At least: a pod of an earlier test may still be leaving.
			return promDeadlines(t) >= deadlinesBefore+1
		})
		waitAlertFiring(t, "HandoffDrainDeadlineExceeded", 10*promInterval)
	}

	// The survivor finishes the returned work, each message once.
	checkQueue(t, maxWork+60*time.Second)
}
