//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
	"github.com/handoff-dev/handoff/protocol"
)

// scaleInRun is what one scale-in of 4 pods to 2 did.
type scaleInRun struct {
	name                string
	leader, job         string   // the pod holding the role Lease, the pod running the long job
	costs               []string // each pod's pod-deletion-cost at the scale-in, "pod=cost"
	victims             []string // the pods the ReplicaSet deleted
	busyDeleted         int      // of leader and job (one pod if the same), deleted
	handedBack          int      // claims handed back by the deleted pods (at stop-claiming or the deadline)
	roleMoves           int      // new holders of the role Lease from the scale-in on
	jobApplied          string   // the pod that applied the long job
	jobDone             time.Duration
	lastVictimGoneAfter time.Duration // from the scale-in to the last victim's deletion
}

// scaleInJob is the long job's work: longer than the pods' drain window
// (a grace period of 30 s less the deadline margin and hand-back reserve),
// so a pod deleted while running it hands it back at the deadline.
const scaleInJob = 45 * time.Second

// TestScaleInKeepsBusyPods scales a Deployment of 4 workers, under load,
// with one pod holding the role Lease and one running a 45 s job, to 2:
// with handoff.dev/deletion-cost on, the ReplicaSet deletes the two idle
// pods (the sidecars rank them cheapest), so no claim is handed back, the
// role does not move and the job finishes where it started. The baseline
// is the same scale-in in the same run without the annotation: the
// ReplicaSet then picks by its own ranking (pods of the same age on one
// node: by UID), blind to what the pods hold. Both runs' figures are
// logged; only the first's are asserted, the baseline's being chance.
func TestScaleInKeepsBusyPods(t *testing.T) {
	with := scaleIn(t, "scalein-cost", true)
	without := scaleIn(t, "scalein-base", false)
	for _, r := range []*scaleInRun{with, without} {
		t.Logf("%-12s leader %s, long job on %s; costs at the scale-in: %s", r.name, r.leader, r.job, strings.Join(r.costs, " "))
		t.Logf("%-12s deleted %v: busy pods deleted %d, claims handed back %d, role moves %d, long job applied by %s %s after its claim, last victim gone %s after the scale-in",
			r.name, r.victims, r.busyDeleted, r.handedBack, r.roleMoves, r.jobApplied, r.jobDone.Round(100*time.Millisecond), r.lastVictimGoneAfter.Round(100*time.Millisecond))
	}
	if with.busyDeleted != 0 || with.handedBack != 0 || with.roleMoves != 0 || with.jobApplied != with.job {
		t.Errorf("with deletion-cost: %d busy pods deleted (of leader %s and job %s; deleted %v), %d claims handed back, %d role moves, the long job applied by %s; want 0, 0, 0 and %s",
			with.busyDeleted, with.leader, with.job, with.victims, with.handedBack, with.roleMoves, with.jobApplied, with.job)
	}
}

// scaleIn runs one scale-in of Deployment name, 4 pods to 2, with the
// pods' deletion cost kept by handoff (cost) or not.
func scaleIn(t *testing.T, name string, cost bool) *scaleInRun {
	t.Helper()
	ctx := context.Background()
	run := &scaleInRun{name: name}
	lease := name + "-leader"
	d := worker(name, 4, 30, "--batch", "1")
	if cost {
		annotate(d, protocol.DeletionCostOptIn, "true")
	}
	rec := record(t, name, lease)
	deploy(t, d)
	holder := waitHeld(rec, time.Minute)
	if holder == "" {
		t.Fatalf("%s: no pod took Lease %s within a minute", name, lease)
	}
	run.leader = podOf(holder)

	l := startLoad(t, name, 8, shortWork)
	defer l.end()
	jobKey := name + "-long"
	if err := queue.Enqueue(ctx, cluster.pool, []queue.Message{{DedupKey: jobKey, Amount: 1, WorkMillis: int(scaleInJob.Milliseconds())}}); err != nil {
		t.Fatal(err)
	}
	var claimedAt time.Time
	for deadline := time.Now().Add(30 * time.Second); run.job == ""; time.Sleep(100 * time.Millisecond) {
		_ = cluster.pool.QueryRow(ctx, `SELECT coalesce(claimed_by, '') FROM handoff_queue WHERE dedup_key = $1`, jobKey).Scan(&run.job)
		if time.Now().After(deadline) {
			t.Fatalf("%s: the long job was not claimed within 30s", name)
		}
	}
	claimedAt = time.Now()
	// The queue is shared: the job must be this Deployment's (the runs
	// are apart, each Deployment gone before the next starts).
	if !strings.HasPrefix(run.job, name+"-") || !strings.HasPrefix(run.leader, name+"-") {
		t.Fatalf("%s: the long job claimed by %s, the Lease held by %s: want pods of Deployment %s", name, run.job, run.leader, name)
	}
	busy := []string{run.leader, run.job}

	// Both runs scale in once the job has run over 10 s (its cost's first
	// step); with the cost kept, also once the busy pods' costs are on
	// them, above every other pod's.
	costOf := func(p *corev1.Pod) int {
		v, err := strconv.Atoi(p.Annotations[corev1.PodDeletionCost])
		if err != nil {
			return -1
		}
		return v
	}
	for deadline := time.Now().Add(45 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		pods, err := cluster.kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		if err != nil {
			t.Fatal(err)
		}
		run.costs = nil
		minBusy, maxIdle := 1<<31, -1
		for _, p := range pods.Items {
			c := costOf(&p)
			run.costs = append(run.costs, fmt.Sprintf("%s=%d", p.Name, c))
			if slices.Contains(busy, p.Name) {
				minBusy = min(minBusy, c)
			} else {
				maxIdle = max(maxIdle, c)
			}
		}
		ready := time.Since(claimedAt) > 12*time.Second && (!cost || minBusy > maxIdle && minBusy >= 20)
		if ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the busy pods %v do not cost more than the others within 45s of the job's claim: %v", name, busy, run.costs)
		}
	}

	scaledAt := time.Now()
	if _, err := cluster.kube.AppsV1().Deployments(namespace).Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"replicas":2}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		rec.mu.Lock()
		run.victims = run.victims[:0]
		gone := 0
		var lastGone time.Time
		for _, p := range rec.pods {
			if !p.terminating.IsZero() && p.terminating.After(scaledAt) {
				run.victims = append(run.victims, p.name)
				if !p.gone.IsZero() {
					gone++
					lastGone = later(lastGone, p.gone)
				}
			}
		}
		rec.mu.Unlock()
		if len(run.victims) == 2 && gone == 2 {
			run.lastVictimGoneAfter = lastGone.Sub(scaledAt)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the scale-in to 2 did not delete 2 pods within 90s (terminating %v, %d gone)", name, run.victims, gone)
		}
	}
	slices.Sort(run.victims)
	for _, p := range slices.Compact(slices.Clone(busy)) {
		if slices.Contains(run.victims, p) {
			run.busyDeleted++
		}
	}
	if err := cluster.pool.QueryRow(ctx, `SELECT count(*) FROM handoff_deliveries WHERE worker = ANY($1) AND outcome IN ($2, $3) AND at >= $4`,
		run.victims, queue.OutcomeReturned, queue.OutcomeHandedBack, scaledAt).Scan(&run.handedBack); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	prev := rec.holderAtLocked(scaledAt)
	for _, h := range rec.holders {
		if h.at.After(scaledAt) && h.holder != "" && h.holder != prev {
			run.roleMoves++
			prev = h.holder
		}
	}
	rec.mu.Unlock()

	// The long job is applied once, where it ran or, handed back, by
	// another pod from the start.
	for deadline := time.Now().Add(2 * scaleInJob); run.jobApplied == ""; time.Sleep(250 * time.Millisecond) {
		var at time.Time
		err := cluster.pool.QueryRow(ctx, `SELECT worker, applied_at FROM handoff_processed WHERE dedup_key = $1`, jobKey).Scan(&run.jobApplied, &at)
		if err == nil {
			run.jobDone = at.Sub(claimedAt)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the long job was not applied within %s", name, 2*scaleInJob)
		}
	}
	// The load stopped and every message applied (nothing lost or applied
	// twice), then the Deployment gone, and its pods with it, before the
	// next run: its pods would take that run's messages from the shared
	// queue.
	l.end()
	checkQueue(t, 2*time.Minute)
	if err := undeploy(ctx, name); err != nil {
		t.Fatal(err)
	}
	return run
}
