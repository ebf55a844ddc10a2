//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
)

// soakWork is the soak's load: the rollout's mix, 100 to 600 ms, and one
// message in slowEvery that cannot finish within the drain window, so
// handing back is exercised too.
func soakWork(i int) int {
	if i%slowEvery == slowEvery/2 {
		return int(slowWork.Milliseconds())
	}
	return 100 + (i*37)%500
}

// soakRun is what one rollout restart of the soak measured.
type soakRun struct {
	took           time.Duration
	lost, twice    int64
	overlaps       int           // leader runs that went back to an earlier holder, or whose holder's token did not grow
	leader         string        // the replaced pod that held the Lease
	handover, free time.Duration // its termination start to the successor holding the Lease; the Lease seen free
}

// TestSoak runs $HANDOFF_E2E_SOAK rollout restarts in a row of one
// Deployment of 3 injected workers under load (e2e/soak.sh; skipped when
// unset). After each, once the queue is empty, it counts the messages lost
// and applied twice, the pods' own leader runs that overlapped (went back to
// an earlier holder, or ran a new holder with a fencing token not above its
// predecessor's), and the handover time of the leaving leader. It prints
// the runs and their sum, writes them to $HANDOFF_E2E_SOAK_OUT if set, and
// fails on any loss, double effect or overlap.
func TestSoak(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv("HANDOFF_E2E_SOAK"))
	if os.Getenv("HANDOFF_E2E_SOAK") == "" {
		t.Skip("HANDOFF_E2E_SOAK unset: the number of rollout restarts to run (e2e/soak.sh, make soak)")
	}
	if err != nil || n < 1 {
		t.Fatalf("HANDOFF_E2E_SOAK=%q: want a number of rollout restarts, 1 or more", os.Getenv("HANDOFF_E2E_SOAK"))
	}
	ctx := context.Background()
	const name, lease = "soak", "soak-leader"
	deploy(t, worker(name, 3, rolloutGrace, "--visibility-timeout", rolloutVisibility.String(), "--concurrency", "8"))
	rec := record(t, name, lease)
	var runs []soakRun
	for i := range n {
		start := time.Now()
		before, err := queue.Check(ctx, cluster.pool)
		if err != nil {
			t.Fatal(err)
		}
		l := startLoad(t, fmt.Sprintf("%s-%d", name, i), loadRate, soakWork)
		time.Sleep(5 * time.Second)
		old := podNames(t, name)
		restart := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"e2e/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
		if _, err := cluster.kube.AppsV1().Deployments(namespace).Patch(ctx, name, types.StrategicMergePatchType, []byte(restart), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		waitRollout(t, name, 3*time.Minute)
		time.Sleep(3 * time.Second)
		l.end()
		after := checkQueue(t, rolloutVisibility+slowWork+30*time.Second)

		r := soakRun{took: time.Since(start)}
		r.lost = (after.Enqueued - before.Enqueued) - (after.Applied - before.Applied) - (after.Pending - before.Pending)
		r.twice = (after.Total - before.Total) + (after.PendingTotal - before.PendingTotal) - (after.WantTotal - before.WantTotal)
		r.overlaps = overlappingRuns(t, lease, start)
		run := &rolloutRun{name: name, handoff: true, lease: lease, rec: rec}
		for _, pod := range old {
			if p := run.measure(t, pod); p.leader {
				r.leader, r.handover, r.free = p.name, p.held, p.free
				if p.successor == "" {
					t.Errorf("run %d: leader %s: no successor seen holding Lease %s", i+1, p.name, lease)
				}
			}
		}
		if r.leader == "" {
			t.Errorf("run %d: none of the replaced pods held Lease %s when it began terminating", i+1, lease)
		}
		if r.lost != 0 || r.twice != 0 || r.overlaps != 0 {
			t.Errorf("run %d: %d messages lost, %d applied twice, %d overlapping leader runs", i+1, r.lost, r.twice, r.overlaps)
		}
		runs = append(runs, r)
		t.Logf("run %d of %d: %s", i+1, n, r)
	}
	rec.checkTerms(t, lease)
	out := soakFigures(runs)
	t.Log("\n" + out)
	if path := os.Getenv("HANDOFF_E2E_SOAK_OUT"); path != "" {
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Error(err)
		}
	}
}

func (r soakRun) String() string {
	return fmt.Sprintf("lost %d, applied twice %d, overlapping leader runs %d, handover of %s %s (free %s), took %s",
		r.lost, r.twice, r.overlaps, r.leader, secs(r.handover), ms(r.free), secs(r.took))
}

// overlappingRuns counts the leader runs of lease since since whose holder
// had already led and been succeeded within that time, or that began a new
// holder's runs with a fencing token not above the predecessor's: moments
// when two pods acted as leader in the same period.
func overlappingRuns(t *testing.T, lease string, since time.Time) int {
	t.Helper()
	bad := 0
	for _, c := range leaderChanges(t, lease, since) {
		if c.back || c.token <= c.prevToken {
			bad++
		}
	}
	return bad
}

// soakFigures is the table of the soak's runs and their sum.
func soakFigures(runs []soakRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d rollout restarts of 3 replicas; grace period %ds; load %d messages/s, 1 in %d takes %s\n",
		len(runs), rolloutGrace, loadRate, slowEvery, slowWork)
	b.WriteString(`  overlaps   the pods' own leader runs that went back to an earlier holder, or began with a fencing token not above the last
  handover   from the leaving leader's termination start to another pod seen holding the Lease (includes its drain);
             "free": how long the Lease was seen free between the release and the takeover

`)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "run\tlost\tapplied twice\toverlaps\thandover\tfree\tleaving leader\ttook")
	var sum soakRun
	for i, r := range runs {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", i+1, r.lost, r.twice, r.overlaps, secs(r.handover), ms(r.free), r.leader, secs(r.took))
		sum.lost += r.lost
		sum.twice += r.twice
		sum.overlaps += r.overlaps
		sum.handover = max(sum.handover, r.handover)
		sum.free = max(sum.free, r.free)
		sum.took += r.took
	}
	fmt.Fprintf(tw, "sum\t%d\t%d\t%d\t%s (worst)\t%s (worst)\t\t%s\n", sum.lost, sum.twice, sum.overlaps, secs(sum.handover), ms(sum.free), secs(sum.took))
	_ = tw.Flush()
	return b.String()
}
