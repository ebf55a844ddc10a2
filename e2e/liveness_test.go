//go:build e2e

package e2e

import (
	"testing"
	"time"
)

// livenessGrace is the grace period of the liveness test's pods: the
// kubelet gives a liveness kill's preStop hook the same.
const livenessGrace = 15

// TestLivenessKillHandsOverAndRearms: the kubelet runs the worker's preStop
// hook for a liveness kill too, while the pod stays. Two workers under load;
// the Lease holder's liveness probe is made to fail, then, once it is back,
// the new holder's, so each pod's worker is killed and restarted once. At
// each kill the pod hands over (DrainStarted … LeaseReleased, new Events of
// that pod) and is not deleted; once the worker is back, some pod holds the
// Lease again and the leader job runs. After both kills a deletion of a pod
// drains again (a new DrainStarted, not the old report), and the queue
// check finds nothing lost and nothing applied twice.
func TestLivenessKillHandsOverAndRearms(t *testing.T) {
	const name, lease = "alive", "alive-leader"
	d := withFaults(worker(name, 2, livenessGrace, "--visibility-timeout", "15s", "--concurrency", "4"), true)
	deploy(t, d)
	rec := record(t, name, lease)
	l := startLoad(t, name, 5, shortWork)

	killed := map[string]bool{}
	for round := 1; round <= 2; round++ {
		holder := podOf(waitHeld(rec, 30*time.Second))
		if holder == "" || killed[holder] {
			// The pod killed before did not take the Lease back: take the
			// other one, so that each pod is killed once.
			t.Errorf("round %d: the Lease is held by %q, not by a pod whose worker was not killed yet", round, holder)
			for _, p := range podNames(t, name) {
				if !killed[p] {
					holder = p
				}
			}
		}
		killed[holder] = true
		before := getPod(t, holder)
		restarts := containerStatus(before, "worker").RestartCount
		_, seen := podEvents(t, holder)
		fault(t, holder, "/fault/unhealthy")
		killedAt := time.Now()

		// The kubelet kills and restarts the worker container; the pod stays.
		var back time.Time
		for deadline := killedAt.Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			p := getPod(t, holder)
			if p == nil || p.UID != before.UID || p.DeletionTimestamp != nil {
				t.Fatalf("round %d: pod %s deleted or replaced after its liveness kill", round, holder)
			}
			if s := containerStatus(p, "worker"); s.RestartCount > restarts && s.Ready {
				back = time.Now()
				t.Logf("round %d: worker of %s restarted (restart count %d, sidecar restart count %d) %s after liveness failed",
					round, holder, s.RestartCount, containerStatus(p, "handoff").RestartCount, back.Sub(killedAt).Round(time.Millisecond))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the worker of %s not restarted and ready a minute after liveness failed", round, holder)
			}
		}
		evs := waitNewEvents(t, holder, seen, 20*time.Second, "DrainStarted", "LeaseReleased")
		t.Logf("round %d: new Events of %s:\n%s", round, holder, describeEvents(evs))

		// The Lease held again, and the leader job running, with both
		// workers up.
		if h := waitHeld(rec, 30*time.Second); h == "" {
			t.Errorf("round %d: no pod holds Lease %s within 30s of the worker of %s being back", round, lease, holder)
		} else if by := waitLeaderRun(t, lease, time.Now(), 15*time.Second); by == "" {
			t.Errorf("round %d: Lease %s held by %s but no leader job ran within 15s", round, lease, h)
		} else {
			t.Logf("round %d: Lease %s held by %s; leader job run by %s", round, lease, h, by)
		}
	}

	// A deletion after the kills: a new sequence, not the old report.
	victim := podOf(waitHeld(rec, 5*time.Second))
	reasons := []string{"DrainStarted", "LeaseReleased"}
	if victim == "" {
		victim, reasons = podNames(t, name)[0], reasons[:1]
	}
	_, seen := podEvents(t, victim)
	deletedAt := time.Now()
	if err := deletePod(victim, nil); err != nil {
		t.Fatal(err)
	}
	gone := waitGone(t, victim, deletedAt, (livenessGrace+10)*time.Second)
	t.Logf("deleted %s: gone after %s", victim, gone.Round(time.Millisecond))
	evs := waitNewEvents(t, victim, seen, 10*time.Second, reasons...)
	t.Logf("new Events of %s after its deletion:\n%s", victim, describeEvents(evs))
	if gone > (livenessGrace+2)*time.Second {
		t.Errorf("pod %s took %s to go, more than its %ds grace period (and 2s for the kubelet)", victim, gone, livenessGrace)
	}
	waitRollout(t, name, 2*time.Minute)
	if h := waitHeld(rec, 30*time.Second); h == "" {
		t.Errorf("no pod holds Lease %s after the deletion of %s", lease, victim)
	}

	time.Sleep(2 * time.Second)
	l.end()
	checkQueue(t, 60*time.Second)
	t.Logf("leader runs by %v", leaderRuns(t, lease))
}
