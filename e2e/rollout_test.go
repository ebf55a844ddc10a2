//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
	"github.com/handoff-dev/handoff/internal/kubetest"
)

// The rollout's workload: a steady load with some work that cannot finish
// within the drain window (grace period less deadline-margin and
// handback-reserve, about 11 s), so handing back is exercised too.
const (
	rolloutGrace      = 15 // seconds
	rolloutVisibility = 30 * time.Second
	loadRate          = 10 // messages a second
	slowEvery         = 40 // one message in slowEvery takes slowWork
	slowWork          = 20 * time.Second
	retryPeriod       = 2 * time.Second // the sidecar's default: the target for a handover after release
)

// TestRolloutRestart restarts 3 workers under a steady load twice in one
// run: injected with handoff, then as the baseline, the same Deployment
// without handoff's annotation, its worker holding the Lease itself with
// client-go (pgworker --without-handoff) and just exiting on SIGTERM. With
// handoff, every message is processed once, the Lease is never seen free
// for longer than the retry period nor held by a pod that is gone, the
// pods' own leader runs never overlap, and claims left at the drain
// deadline are handed back. The figures of both rollouts are logged, and
// written to $HANDOFF_E2E_FIGURES if set, and drawn as an SVG picture
// (rolloutPicture) to $HANDOFF_E2E_FIGURES_SVG if set (both paths of
// files, from e2e/rollout-figures.sh).
func TestRolloutRestart(t *testing.T) {
	var with, without *rolloutRun
	t.Run("handoff", func(t *testing.T) {
		with = restartUnderLoad(t, "orders", true)
		with.assertHandedOver(t)
	})
	t.Run("baseline", func(t *testing.T) {
		without = restartUnderLoad(t, "plain", false)
	})
	if with == nil || without == nil {
		return
	}
	figures := rolloutFigures(with, without)
	t.Log("\n" + figures)
	if path := os.Getenv("HANDOFF_E2E_FIGURES"); path != "" {
		if err := os.WriteFile(path, []byte(figures), 0o644); err != nil {
			t.Error(err)
		}
	}
	if path := os.Getenv("HANDOFF_E2E_FIGURES_SVG"); path != "" {
		svg := rolloutPicture(rolloutWorkload(), with.replaced, without.replaced).SVG()
		if err := os.WriteFile(path, svg, 0o644); err != nil {
			t.Error(err)
		}
	}
}

// rolloutRun is what one rollout restart measured.
type rolloutRun struct {
	name        string
	handoff     bool
	lease       string
	rec         *recorder
	replaced    []*replacedPod
	before      queue.Report // the queue check before the run
	report      queue.Report // and after it
	enqueued    int
	idleGone    time.Duration // a pod with nothing to drain: termination start to gone, the median of idleSamples
	idleSamples []time.Duration
	// idleStopped: the same pods' termination start to every container
	// reported terminated (podSeen.stopped), the median and each.
	idleStopped        time.Duration
	idleStoppedSamples []time.Duration
	// backlog is a pod deleted while it held claimed batches it had not
	// started (deleteBackloggedPod).
	backlog *replacedPod
	// moves is how many times the Lease passed from one pod to another
	// from the restart until the queue emptied after it, and path the pods
	// that held it in turn (recorder.moves).
	moves int
	path  []string
}

// restartUnderLoad deploys 3 workers named name, restarts them under load
// the way kubectl rollout restart does, waits until the queue is empty, and
// returns what it measured. The queue check and the loss and duplicate
// counts are asserted for both: handlers are idempotent either way.
func restartUnderLoad(t *testing.T, name string, handoff bool) *rolloutRun {
	ctx := context.Background()
	lease := name + "-leader"
	d := worker(name, 3, rolloutGrace, "--visibility-timeout", rolloutVisibility.String(), "--concurrency", "8")
	if !handoff {
		d = withoutHandoff(d)
	}
	deploy(t, d)
	run := &rolloutRun{name: name, handoff: handoff, lease: lease, rec: record(t, name, lease)}
	var err error
	if run.before, err = queue.Check(ctx, cluster.pool); err != nil {
		t.Fatal(err)
	}

	var load sync.WaitGroup
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	load.Go(func() {
		tick := time.NewTicker(time.Second / loadRate)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-loadCtx.Done():
				return
			case <-tick.C:
			}
			work := 100 + (i*37)%500
			if i%slowEvery == slowEvery/2 {
				work = int(slowWork.Milliseconds())
			}
			msgs := []queue.Message{{DedupKey: fmt.Sprintf("%s-%d", name, i), Amount: int64(i%7 + 1), WorkMillis: work}}
			if err := queue.Enqueue(loadCtx, cluster.pool, msgs); err != nil {
				if loadCtx.Err() == nil {
					t.Errorf("enqueue: %v", err)
				}
				return
			}
			run.enqueued++
		}
	})
	time.Sleep(5 * time.Second) // every pod is working, and one leads

	old := podNames(t, name)
	if run.rec.holderAt(time.Now()) == "" {
		t.Fatalf("no pod of %s holds Lease %s before the restart", name, lease)
	}
	// An operator's view of it, as it happens (handoff status --watch).
	var stopStatus func() ([]statusView, string)
	var alerts *alertsBefore
	if handoff {
		stopStatus = statusWatch(t, name)
		alerts = promBefore(t)
	}
	restart := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"e2e/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
	restartAt := time.Now()
	if _, err := cluster.kube.AppsV1().Deployments(namespace).Patch(ctx, name, types.StrategicMergePatchType, []byte(restart), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRollout(t, name, 3*time.Minute)
	time.Sleep(3 * time.Second)
	stopLoad()
	load.Wait()
	if handoff {
		views, draining := stopStatus()
		assertStatusSawTheHandover(t, views, lease, old)
		t.Logf("during the rollout, as a pod drained:\n%s\nafter it:\n%s", draining, statusText(t, name))
		// A real Prometheus scraped the sidecars and the webhook through
		// the rollout: the webhook counted every old pod's shutdown from
		// its ShutdownFinished Event, once, the chart's alerts fired only for
		// drains that reached their deadline, and the dashboard shows it.
		since := time.Now()
		for _, pod := range old {
			waitGone(t, pod, since, time.Duration(rolloutGrace+15)*time.Second)
		}
		checkRolloutSeen(t, alerts, old)
		checkDashboard(t)
	}

	// Every message processed: the handed-back ones within their work, the
	// stranded ones after their visibility timeout and their work.
	run.report = checkQueue(t, rolloutVisibility+slowWork+30*time.Second)
	// The rollout's moves, counted once the queue is empty: by then the
	// baseline's Lease, which its leaving holder did not release, has
	// expired and been taken by a pod that stays.
	run.moves, run.path = run.rec.moves(restartAt, time.Now())
	t.Logf("Lease %s from the restart until the queue emptied: %d moves, held in turn by %s", lease, run.moves, strings.Join(run.path, " → "))

	run.idleGone, run.idleSamples, run.idleStopped, run.idleStoppedSamples = deleteIdlePod(t, run)
	run.backlog = deleteBackloggedPod(t, run)
	// The backlog's messages processed too: the baseline's after their visibility timeout.
	run.report = checkQueue(t, rolloutVisibility+backlogBatch*backlogWork+30*time.Second)

	for _, pod := range old {
		p := run.measure(t, pod)
		if handoff && p.leader && p.successor != "" {
			p.hops = run.hopsOf(t, p)
		}
		run.replaced = append(run.replaced, p)
		if p.lost > 0 || p.duplicates > 0 {
			t.Errorf("pod %s: %d of its messages lost, %d delivered again after being applied", pod, p.lost, p.duplicates)
		}
	}
	return run
}

// The backlog of deleteBackloggedPod: backlogBatches batches of the
// worker's --batch (4, its default), each message taking backlogWork, so
// that the pods holding them hold their last 3 unstarted while other claim
// loops poll an empty queue.
const (
	backlogBatches = 8
	backlogBatch   = 4
	backlogWork    = 3 * time.Second
)

// deleteBackloggedPod enqueues a short backlog, deletes the pod that holds
// the most of it once the claim loops have taken it all, and returns what
// happened to that pod's claims (measure): with handoff, its unstarted
// claims are handed back at stop-claiming (HandBack) and claimed by the
// idle loops of the other pods; without, its claims wait for their
// visibility timeout.
func deleteBackloggedPod(t *testing.T, run *rolloutRun) *replacedPod {
	t.Helper()
	ctx := context.Background()
	var msgs []queue.Message
	for i := range backlogBatches * backlogBatch {
		msgs = append(msgs, queue.Message{DedupKey: fmt.Sprintf("%s-backlog-%d", run.name, i), Amount: 1, WorkMillis: int(backlogWork.Milliseconds())})
	}
	if err := queue.Enqueue(ctx, cluster.pool, msgs); err != nil {
		t.Fatal(err)
	}
	run.enqueued += len(msgs)
	var pod string
	var held int
	kubetest.WaitFor(t, 10*time.Second, "the backlog to be claimed", func() bool {
		err := cluster.pool.QueryRow(ctx, `
SELECT claimed_by, count(*) FROM handoff_queue WHERE dedup_key LIKE $1 AND claimed_by IS NOT NULL
GROUP BY claimed_by ORDER BY count(*) DESC, claimed_by LIMIT 1`, run.name+"-backlog-%").Scan(&pod, &held)
		if err != nil {
			return false
		}
		var visible int
		err = cluster.pool.QueryRow(ctx, `SELECT count(*) FROM handoff_queue WHERE dedup_key LIKE $1 AND claimed_by IS NULL`,
			run.name+"-backlog-%").Scan(&visible)
		return err == nil && visible == 0
	})
	t.Logf("deleting %s, which holds %d messages of the backlog", pod, held)
	run.rec.deleting(pod)
	if err := cluster.kube.CoreV1().Pods(namespace).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	kubetest.WaitFor(t, time.Duration(rolloutGrace+15)*time.Second, "the backlogged pod to go", func() bool {
		run.rec.mu.Lock()
		defer run.rec.mu.Unlock()
		s := run.rec.pods[pod]
		return s != nil && !s.gone.IsZero()
	})
	// Its claims settled: claimed again by others (at once, or after their
	// visibility timeout), or completed.
	kubetest.WaitFor(t, rolloutVisibility+30*time.Second, "the backlogged pod's unfinished claims to be claimed again", func() bool {
		var waiting int
		err := cluster.pool.QueryRow(ctx, `
SELECT count(*) FROM handoff_queue WHERE dedup_key LIKE $1 AND (claimed_by = $2 OR claimed_by IS NULL)`,
			run.name+"-backlog-%", pod).Scan(&waiting)
		return err == nil && waiting == 0
	})
	return run.measure(t, pod)
}

// idleSamples is how many idle pods deleteIdlePod deletes, one at a time:
// the kubelet's own part of a pod's removal varies by up to 2 s (its
// housekeeping removes the pod's cgroup every 2 s, and the object is
// deleted only after), so one deletion says little.
const idleSamples = 5

// deleteIdlePod deletes idleSamples pods of the run's Deployment in turn
// once the queue is empty, so they have nothing to drain, each once the
// Deployment is back to its replicas. It returns the median and every
// sample of their times from termination start to Pod object gone, and
// from termination start to every container reported stopped (a pod
// whose stop was not seen, the delete coming first, counts as gone).
func deleteIdlePod(t *testing.T, run *rolloutRun) (gone time.Duration, goneEach []time.Duration, stopped time.Duration, stoppedEach []time.Duration) {
	t.Helper()
	for range idleSamples {
		waitRollout(t, run.name, 2*time.Minute)
		pod := oldestPod(t, run.name)
		run.rec.deleting(pod)
		if err := cluster.kube.CoreV1().Pods(namespace).Delete(context.Background(), pod, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		var g, st time.Duration
		kubetest.WaitFor(t, time.Duration(rolloutGrace+15)*time.Second, "idle pod "+pod+" to go", func() bool {
			run.rec.mu.Lock()
			defer run.rec.mu.Unlock()
			if s := run.rec.pods[pod]; s != nil && !s.terminating.IsZero() && !s.gone.IsZero() {
				g, st = s.gone.Sub(s.start()), s.gone.Sub(s.start())
				if !s.stopped.IsZero() {
					st = s.stopped.Sub(s.start())
				}
			}
			return g != 0
		})
		goneEach, stoppedEach = append(goneEach, g), append(stoppedEach, st)
	}
	return medianOf(goneEach), goneEach, medianOf(stoppedEach), stoppedEach
}

// oldestPod is the pod of app created first: a settled one. The kubelet
// starts a pod's termination only once it has a status of the pod newer
// than its last sync (its PLEG relists every second), so a pod deleted
// while the kubelet still syncs it for its start (a new pod just Ready,
// its native sidecar's startup probe) waits up to a second more before
// its preStop hook runs, whatever runs in it.
func oldestPod(t *testing.T, app string) string {
	t.Helper()
	pods, err := cluster.kube.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("the pods of %s: %v (%d)", app, err, len(pods.Items))
	}
	oldest := pods.Items[0]
	for _, p := range pods.Items[1:] {
		if p.CreationTimestamp.Before(&oldest.CreationTimestamp) || (p.CreationTimestamp.Equal(&oldest.CreationTimestamp) && p.Name < oldest.Name) {
			oldest = p
		}
	}
	return oldest.Name
}

func medianOf(ds []time.Duration) time.Duration {
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	return sorted[len(sorted)/2]
}

// assertHandedOver checks the handoff rollout: each leaving leader's Lease
// went to a successor while the leaver was still running, within the
// retry period of its release; every claim left at the deadline was handed
// back; the Lease was held by exactly one live pod at every observation;
// and the pods' own leader runs never interleaved.
func (r *rolloutRun) assertHandedOver(t *testing.T) {
	t.Helper()
	leaders := 0
	for _, p := range r.replaced {
		if p.unfinished != p.returned {
			t.Errorf("pod %s left %d claims unfinished but handed back %d", p.name, p.unfinished, p.returned)
		}
		if !p.leader {
			continue
		}
		leaders++
		switch {
		case p.successor == "":
			t.Errorf("leader %s: no successor seen holding Lease %s", p.name, r.lease)
		case p.held > p.gone:
			t.Errorf("leader %s: successor %s held the Lease %s after termination start, after the pod was gone (%s)", p.name, p.successor, p.held, p.gone)
		case p.free > retryPeriod:
			t.Errorf("leader %s: the Lease was free for %s before %s took it; want within the retry period %s", p.name, p.free, p.successor, retryPeriod)
		}
	}
	if leaders == 0 {
		t.Errorf("none of the replaced pods held Lease %s when it began terminating", r.lease)
	}
	// The backlogged pod held batches it had not started: they went back at
	// stop-claiming, and nothing was left for its deadline.
	if b := r.backlog; b != nil {
		if b.handedBack == 0 || b.unfinished != b.returned {
			t.Errorf("backlogged pod %s: %d claims unfinished, %d handed back, %d of them unstarted at stop-claiming; want every unfinished one handed back, some unstarted",
				b.name, b.unfinished, b.returned, b.handedBack)
		}
	}

	// Every holder seen is a pod of the Deployment, and no pod still holds
	// the Lease when it is gone: a pod that is gone writes no more, so its
	// name would stay on the Lease until a successor took it.
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	for _, o := range r.rec.holders {
		if o.holder != "" && r.rec.pods[podOf(o.holder)] == nil {
			t.Errorf("%s: Lease %s held by %q, not a pod of %s", o.at.Format("15:04:05.000"), r.lease, o.holder, r.name)
		}
	}
	for _, p := range r.rec.pods {
		if !p.gone.IsZero() && podOf(r.rec.holderAtLocked(p.gone)) == p.name {
			t.Errorf("%s: pod %s gone while Lease %s still named it", p.gone.Format("15:04:05.000"), p.name, r.lease)
		}
	}

	// The pods' own view: leader runs, in time order, never go back to an
	// earlier holder, and each new holder has a higher fencing token.
	var holders []string
	for _, c := range leaderChanges(t, r.lease, time.Time{}) {
		if c.back {
			t.Errorf("leader runs went back to %s after %s: two pods acted as leader in the same period", c.holder, c.prev)
		}
		if c.token <= c.prevToken {
			t.Errorf("leader %s ran with fencing token %d, not above its predecessor's %d", c.holder, c.token, c.prevToken)
		}
		holders = append(holders, c.holder)
	}
	if len(holders) < 2 {
		t.Errorf("leader runs by %v: want the leader job to move to a new pod during the rollout", holders)
	}
}

// podNames lists the pods of app now.
func podNames(t *testing.T, app string) []string {
	t.Helper()
	pods, err := cluster.kube.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name)
	}
	return names
}

// rolloutFigures is the comparison of the two rollouts, per replaced pod
// and in summary, with a legend.
func rolloutFigures(with, without *rolloutRun) string {
	var b strings.Builder
	b.WriteString(rolloutWorkload() + "\n")
	fmt.Fprintf(&b, "Prometheus scraping the sidecars and the webhook every %s (HANDOFF_E2E_SCRAPE_INTERVAL; no pod waits for a scrape).\n", promInterval)
	fmt.Fprintf(&b, `Times are from each pod's termination start (its deletionTimestamp seen; for the pods the test deletes itself, the idle and
backlogged ones, its delete request sent); the kubelet runs the preStop hook about 0.1 s later.
  pod gone                 until the Pod object was deleted
  Lease held by successor  for the pod that held the Lease at termination start: until another pod was seen holding it;
                           "free": how long it was seen free between the release and the takeover ("-": not the holder)
  unfinished               claims the pod took and did not complete itself
  claimed again            until the last of those was claimed by another pod
  returned                 how many of those the pod handed back, and when, from its drain deadline
  lost/dup                 its messages lost / delivered again after being applied
With handoff the Lease guards the leader job, a role (handoff.dev/role-leases): the sequence starts at the deletion, and a
leaving leader revokes and releases it right after stop-claiming, beside its drain.
"pod with nothing to drain": %d pods deleted in turn after the queue emptied, each the oldest, from termination start to every container
reported stopped (the kubelet's status), and to Pod gone (after the kubelet's cleanup, which waits for its housekeeping, every 2 s).
"backlogged pod": then a backlog of %d batches of %d messages of %s each, and the pod holding most of it deleted once
all of it was claimed: from its termination start until the last of the claims it had not started (with handoff, handed
back at stop-claiming) was claimed by another pod; the baseline has no such hand-back, and its row is every unfinished claim.

`, idleSamples, backlogBatches, backlogBatch, backlogWork)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\treplaced pod\tpod gone\tLease held by successor\tunfinished\tclaimed again\treturned\tlost/dup")
	for _, r := range []*rolloutRun{with, without} {
		pods := r.replaced
		if r.backlog != nil {
			pods = append(slices.Clone(pods), r.backlog)
		}
		for _, p := range pods {
			name := p.name
			if p == r.backlog {
				name += " (backlog)"
			}
			held := "-"
			if p.leader {
				held = "never"
				if p.successor != "" {
					held = secs(p.held)
					if r.handoff {
						held += fmt.Sprintf(" (free %s)", ms(p.free))
					}
				}
			}
			claimed, returned := "-", "-"
			if p.unfinished > 0 {
				claimed = secs(p.claimed)
			}
			var parts []string
			if p.handedBack > 0 {
				parts = append(parts, fmt.Sprintf("%d unstarted at stop-claiming", p.handedBack))
			}
			if atDeadline := p.returned - p.handedBack; atDeadline > 0 && !p.drainBy.IsZero() {
				parts = append(parts, fmt.Sprintf("%d at deadline %s", atDeadline, signedMs(p.terminating.Add(p.returnedAt).Sub(p.drainBy))))
			}
			if len(parts) > 0 {
				returned = strings.Join(parts, ", ")
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d/%d\n", r.kind(), name, secs(p.gone), held, p.unfinished, claimed, returned, p.lost, p.duplicates)
		}
	}
	_ = tw.Flush()

	w, wo := with.summary(), without.summary()
	b.WriteString("\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "\thandoff\tbaseline\tratio")
	row := func(name string, a, b2 time.Duration) {
		ratio := "-"
		if a > 0 && b2 > 0 && a > b2 {
			ratio = fmt.Sprintf("+%s", short(a-b2))
		} else if a > 0 && b2 > 0 {
			ratio = fmt.Sprintf("%.1fx", float64(b2)/float64(a))
			if b2 >= 100*a {
				ratio = fmt.Sprintf("%.0fx", float64(b2)/float64(a))
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, short(a), short(b2), ratio)
	}
	row("no live pod holding the Lease (total)", w.vacant, wo.vacant)
	row("termination start → role Lease held by successor (worst leader)", w.held, wo.held)
	row(fmt.Sprintf("pod with nothing to drain: containers stopped (median of %d)", idleSamples), with.idleStopped, without.idleStopped)
	row(fmt.Sprintf("pod with nothing to drain gone (median of %d)", idleSamples), with.idleGone, without.idleGone)
	row("unfinished claims claimed again (worst)", w.claimed, wo.claimed)
	if b, bo := with.backlog, without.backlog; b != nil && bo != nil {
		row(fmt.Sprintf("backlogged pod: unstarted claims claimed again (%d; baseline: its %d unfinished)", b.handedBack, bo.unfinished),
			b.handedClaimed, bo.claimed)
	}
	fmt.Fprintf(tw, "Lease moves in the rollout (pod to pod; the least possible is 1)\t%d\t%d\n", with.moves, without.moves)
	fmt.Fprintf(tw, "unfinished claims at termination (all pods)\t%d\t%d\n", w.unfinished, wo.unfinished)
	late := "-"
	if w.returned > 0 {
		late = signedMs(w.returnLate)
	}
	fmt.Fprintf(tw, "claims handed back, from the drain deadline (worst)\t%s\t-\n", late)
	fmt.Fprintf(tw, "messages lost / applied twice\t%s\t%s\n", with.lostDup(), without.lostDup())
	fmt.Fprintf(tw, "messages enqueued during the run\t%d\t%d\n", with.enqueued, without.enqueued)
	fmt.Fprintf(tw, "idle pods: containers stopped, each\t%s\t%s\n", shorts(with.idleStoppedSamples), shorts(without.idleStoppedSamples))
	fmt.Fprintf(tw, "idle pods gone, each\t%s\t%s\n", shorts(with.idleSamples), shorts(without.idleSamples))
	_ = tw.Flush()
	for _, p := range with.replaced {
		if !p.hops.termination.IsZero() {
			fmt.Fprintf(&b, "\nhandoff: leader %s handed over to %s, hop by hop\n%s", p.name, podOf(p.successor), hopsTable(p.hops))
		}
	}
	return b.String()
}

// rolloutWorkload is the rollout's workload in a line, the figures' first.
func rolloutWorkload() string {
	return fmt.Sprintf("kubectl rollout restart of 3 replicas; grace period %ds; visibility timeout %s; load %d messages/s, 1 in %d takes %s",
		rolloutGrace, rolloutVisibility, loadRate, slowEvery, slowWork)
}

func (r *rolloutRun) kind() string {
	if r.handoff {
		return "handoff"
	}
	return "baseline"
}

// lostDup is this run's messages lost and effects applied twice: the queue
// check after the run less the one before it.
func (r *rolloutRun) lostDup() string {
	a, b := r.before, r.report
	lost := (b.Enqueued - a.Enqueued) - (b.Applied - a.Applied) - (b.Pending - a.Pending)
	double := (b.Total - a.Total) + (b.PendingTotal - a.PendingTotal) - (b.WantTotal - a.WantTotal)
	return fmt.Sprintf("%d / %d", lost, double)
}

type runSummary struct {
	held, vacant, claimed, returnLate time.Duration
	unfinished, returned              int
}

func (r *rolloutRun) summary() runSummary {
	var s runSummary
	for _, p := range r.replaced {
		if p.leader {
			s.held = max(s.held, p.held)
		}
		s.claimed = max(s.claimed, p.claimed)
		s.unfinished += p.unfinished
		if atDeadline := p.returned - p.handedBack; atDeadline > 0 && !p.drainBy.IsZero() {
			late := p.terminating.Add(p.returnedAt).Sub(p.drainBy)
			if s.returned == 0 || late > s.returnLate {
				s.returnLate = late
			}
			s.returned += atDeadline
		}
	}
	s.vacant = r.rec.vacant()
	return s
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

// short is d in milliseconds under a second, else in seconds.
func short(d time.Duration) string {
	if d < time.Second {
		return ms(d)
	}
	return secs(d)
}

// shorts is ds, each as short gives it.
func shorts(ds []time.Duration) string {
	var out []string
	for _, d := range ds {
		out = append(out, short(d))
	}
	return strings.Join(out, ", ")
}

func ms(d time.Duration) string { return fmt.Sprintf("%d ms", d.Milliseconds()) }

func signedMs(d time.Duration) string { return fmt.Sprintf("%+d ms", d.Milliseconds()) }
