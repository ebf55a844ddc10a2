//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
)

// The mid-drain faults' workload: work that drains within the drain window
// (grace period less deadline-margin and handback-reserve, 16 s) and whose
// claims are hidden for longer than it lasts, so a claim comes back only
// when its worker is gone.
const (
	faultGrace      = 20 // seconds
	faultWork       = 12 * time.Second
	faultVisibility = 20 * time.Second
)

// drainUnderWay is a pod of a 2-replica Deployment deleted while it holds
// the Lease and claims: its drain has started (a new DrainStarted Event).
type drainUnderWay struct {
	name, lease, victim string
	rec                 *recorder
	claims              int
	deletedAt           time.Time
	seen                events // the victim's Events before its deletion
}

// startDrain deploys d (2 replicas of name), gives the workers 8 messages
// of faultWork, deletes the Lease holder once it holds claims, and returns
// when its sidecar has started to drain.
func startDrain(t *testing.T, d *appsv1.Deployment) *drainUnderWay {
	t.Helper()
	ctx := context.Background()
	name := d.Name
	deploy(t, d)
	u := &drainUnderWay{name: name, lease: name + "-leader", rec: record(t, name, name+"-leader")}
	var msgs []queue.Message
	for i := range 8 {
		msgs = append(msgs, queue.Message{DedupKey: fmt.Sprintf("%s-%d", name, i), Amount: int64(i + 1), WorkMillis: int(faultWork.Milliseconds())})
	}
	if err := queue.Enqueue(ctx, cluster.pool, msgs); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		u.victim = podOf(u.rec.holderAt(time.Now()))
		var unclaimed int
		err := cluster.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE claimed_by = $1), count(*) FILTER (WHERE claimed_by IS NULL)
			FROM handoff_queue WHERE dedup_key LIKE $2`, u.victim, name+"-%").Scan(&u.claims, &unclaimed)
		if err != nil {
			t.Fatal(err)
		}
		if u.victim != "" && u.claims > 0 && unclaimed == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Lease holder %q has %d claims, %d messages unclaimed, 30s after the enqueue", u.victim, u.claims, unclaimed)
		}
	}
	_, u.seen = podEvents(t, u.victim)
	u.deletedAt = time.Now()
	if err := deletePod(u.victim, nil); err != nil {
		t.Fatal(err)
	}
	waitNewEvents(t, u.victim, u.seen, 10*time.Second, "DrainStarted")
	t.Logf("Lease holder %s with %d claims deleted; its drain started %s later", u.victim, u.claims, time.Since(u.deletedAt).Round(time.Millisecond))
	return u
}

// goneInGrace waits for the victim to go and fails the test if it took
// longer than its grace period (and 2 s for the kubelet's bookkeeping).
func (u *drainUnderWay) goneInGrace(t *testing.T) {
	t.Helper()
	gone := waitGone(t, u.victim, u.deletedAt, (faultGrace+15)*time.Second)
	t.Logf("pod %s gone %s after its deletion (grace period %ds)", u.victim, gone.Round(time.Millisecond), faultGrace)
	if gone > (faultGrace+2)*time.Second {
		t.Errorf("pod %s took %s to go, more than its %ds grace period (and 2s)", u.victim, gone, faultGrace)
	}
}

// nodeOnly skips tests that reach into the node's containerd, which only
// our own cluster has on this machine.
func nodeOnly(t *testing.T) {
	t.Helper()
	if cluster.ctr == nil {
		t.Skip("needs the node's containerd on this machine (the cluster e2e/cluster boots)")
	}
}

// signalSidecar sends sig (SIGKILL, SIGTERM) to the handoff sidecar
// container of pod, through the node's containerd.
func signalSidecar(t *testing.T, pod, sig string) {
	t.Helper()
	p := getPod(t, pod)
	if p == nil {
		t.Fatalf("pod %s is gone: no sidecar to send %s", pod, sig)
	}
	id := containerStatus(p, "handoff").ContainerID
	_, id, ok := strings.Cut(id, "containerd://")
	if !ok {
		t.Fatalf("pod %s: the sidecar has no containerd container ID (%q)", pod, containerStatus(p, "handoff").ContainerID)
	}
	args := append(append([]string{}, cluster.ctr[1:]...), "tasks", "kill", "--signal", sig, id)
	if out, err := exec.Command(cluster.ctr[0], args...).CombinedOutput(); err != nil {
		t.Fatalf("ctr tasks kill --signal %s (sidecar of %s): %v: %s", sig, pod, err, out)
	}
}

// TestSidecarKilledMidDrain: the sidecar of the Lease holder is SIGKILLed
// while it drains. It cannot release the Lease, so no other pod may hold it
// before the last term it renewed is over; the claims it held come back
// (after their visibility timeout) and are applied once; the pod still goes
// within its grace period.
func TestSidecarKilledMidDrain(t *testing.T) {
	nodeOnly(t)
	d := worker("sigkill", 2, faultGrace, "--visibility-timeout", faultVisibility.String(), "--concurrency", "4")
	u := startDrain(t, d)
	signalSidecar(t, u.victim, "SIGKILL")
	t.Logf("sidecar of %s killed %s after the deletion", u.victim, time.Since(u.deletedAt).Round(time.Millisecond))
	u.goneInGrace(t)
	if h := waitHeld(u.rec, 30*time.Second); h == "" || podOf(h) == u.victim {
		t.Errorf("Lease %s held by %q 30s after its holder's sidecar was killed; want the other pod", u.lease, h)
	}
	u.rec.checkTerms(t, u.lease)
	checkQueue(t, faultVisibility+faultWork+30*time.Second)
	t.Logf("leader runs by %v", leaderRuns(t, u.lease))
}

// TestWorkerCrashMidDrain: the worker of the Lease holder crashes while its
// sidecar drains it. The sequence ends at once (the app is gone) rather than
// at the deadline, the Lease is released, the crashed worker's claims come
// back (after their visibility timeout) and are applied once, and the pod
// goes within its grace period.
func TestWorkerCrashMidDrain(t *testing.T) {
	d := withFaults(worker("crash", 2, faultGrace, "--visibility-timeout", faultVisibility.String(), "--concurrency", "4"), false)
	u := startDrain(t, d)
	fault(t, u.victim, "/fault/crash")
	crashed := time.Now()
	evs := waitNewEvents(t, u.victim, u.seen, 10*time.Second, "LeaseReleased")
	t.Logf("new Events of %s:\n%s", u.victim, describeEvents(evs))
	for _, e := range evs {
		if e.Reason == "DrainDeadlineExceeded" {
			t.Errorf("the drain of %s waited for its deadline although its worker had crashed: %s", u.victim, e.Message)
		}
	}
	if released := time.Since(crashed); released > 5*time.Second {
		t.Errorf("Lease released %s after the worker crashed; want at once (the app is gone)", released)
	}
	u.goneInGrace(t)
	if h := waitHeld(u.rec, 10*time.Second); h == "" || podOf(h) == u.victim {
		t.Errorf("Lease %s held by %q after the release; want the other pod", u.lease, h)
	}
	u.rec.checkTerms(t, u.lease)
	checkQueue(t, faultVisibility+faultWork+30*time.Second)
}
