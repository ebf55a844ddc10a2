//go:build e2e

package e2e

import (
	"context"
	"regexp"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// measure reads what happened to the replaced pod from the recorder, its
// Events and the queue's delivery history.
func (r *rolloutRun) measure(t *testing.T, pod string) *replacedPod {
	t.Helper()
	p := &replacedPod{name: pod}
	r.rec.mu.Lock()
	s := r.rec.pods[pod]
	if s == nil || s.terminating.IsZero() {
		r.rec.mu.Unlock()
		t.Errorf("pod %s: its termination was not seen", pod)
		return p
	}
	p.terminating = s.start()
	if !s.gone.IsZero() {
		p.gone = s.gone.Sub(p.terminating)
	}
	p.leader = podOf(r.rec.holderAtLocked(p.terminating)) == pod
	if p.leader {
		var freeSince time.Time
		for _, o := range r.rec.holders {
			switch {
			case !o.at.After(p.terminating):
			case o.holder == "":
				if freeSince.IsZero() {
					freeSince = o.at
				}
			case podOf(o.holder) == pod:
				freeSince = time.Time{}
			default:
				p.successor, p.held = o.holder, o.at.Sub(p.terminating)
				if !freeSince.IsZero() {
					p.free = o.at.Sub(freeSince)
				}
			}
			if p.successor != "" {
				break
			}
		}
	}
	r.rec.mu.Unlock()

	ctx := context.Background()
	var returnedAt, againAt, handedAgainAt *time.Time
	err := cluster.pool.QueryRow(ctx, `
WITH mine AS (
	SELECT message_id, min(at) AS claimed_at FROM handoff_deliveries
	WHERE worker = $1 AND outcome = 'claimed' GROUP BY message_id
), m AS (
	SELECT
		EXISTS (SELECT 1 FROM handoff_deliveries d WHERE d.message_id = mine.message_id AND d.worker = $1
			AND d.outcome IN ('applied', 'duplicate')) AS finished,
		(SELECT max(at) FROM handoff_deliveries d WHERE d.message_id = mine.message_id AND d.worker = $1
			AND d.outcome = 'returned') AS returned_at,
		EXISTS (SELECT 1 FROM handoff_deliveries d WHERE d.message_id = mine.message_id AND d.worker = $1
			AND d.outcome = 'handed-back') AS handed_back,
		(SELECT min(at) FROM handoff_deliveries d WHERE d.message_id = mine.message_id AND d.worker <> $1
			AND d.outcome = 'claimed' AND d.at > mine.claimed_at) AS again_at,
		EXISTS (SELECT 1 FROM handoff_processed p WHERE p.message_id = mine.message_id)
			OR EXISTS (SELECT 1 FROM handoff_queue q WHERE q.id = mine.message_id) AS kept,
		(SELECT count(*) FROM handoff_deliveries d WHERE d.message_id = mine.message_id AND d.outcome = 'duplicate') AS dups
	FROM mine
)
SELECT
	count(*) FILTER (WHERE NOT finished),
	count(*) FILTER (WHERE NOT finished AND (returned_at IS NOT NULL OR handed_back)),
	max(returned_at) FILTER (WHERE NOT finished),
	max(again_at) FILTER (WHERE NOT finished),
	count(*) FILTER (WHERE NOT finished AND handed_back),
	max(again_at) FILTER (WHERE NOT finished AND handed_back),
	count(*) FILTER (WHERE NOT kept),
	coalesce(sum(dups), 0)::int
FROM m`, pod).Scan(&p.unfinished, &p.returned, &returnedAt, &againAt, &p.handedBack, &handedAgainAt, &p.lost, &p.duplicates)
	if err != nil {
		t.Fatalf("pod %s: reading its deliveries: %v", pod, err)
	}
	if returnedAt != nil {
		p.returnedAt = returnedAt.Sub(p.terminating)
	}
	if againAt != nil {
		p.claimed = againAt.Sub(p.terminating)
	}
	if handedAgainAt != nil {
		p.handedClaimed = handedAgainAt.Sub(p.terminating)
	}
	if r.handoff {
		p.drainBy = drainDeadline(t, pod)
	}
	return p
}

var drainUntil = regexp.MustCompile(`drain until ([^,\s]+)`)

// drainDeadline is the drain deadline the sidecar of pod announced in its
// DrainStarted Event.
func drainDeadline(t *testing.T, pod string) time.Time {
	t.Helper()
	events, err := cluster.kube.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + pod + ",reason=DrainStarted"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if m := drainUntil.FindStringSubmatch(e.Message); m != nil {
			if at, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
				return at
			}
		}
	}
	t.Errorf("pod %s: no DrainStarted Event with its drain deadline", pod)
	return time.Time{}
}

// vacant is how long, in all, the Lease was seen free or held by a pod that
// was already gone: time in which no live pod could lead.
func (r *recorder) vacant() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var total time.Duration
	for i := 0; i+1 < len(r.holders); i++ {
		o, next := r.holders[i], r.holders[i+1].at
		if o.holder == "" {
			total += next.Sub(o.at)
			continue
		}
		if p := r.pods[podOf(o.holder)]; p != nil && !p.gone.IsZero() && p.gone.Before(next) {
			total += next.Sub(later(p.gone, o.at))
		}
	}
	return total
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
