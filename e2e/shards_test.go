//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/sidecar"
)

// The shard set of TestShardRollout: shardCount Leases shardPrefix0 …,
// which the chart's Role lets serviceAccount hold (e2e_test.go's chart
// values: rbac.sidecarBindings[].shards).
const (
	shardPrefix   = "shard-"
	shardCount    = 12
	shardReplicas = 3
	shardLoadRate = 10 // messages a second, spread over the shards
	// shardTakeover bounds the time from a shard's release (the Lease seen
	// free) to its next holder: a retry period for the assigned pod's plan
	// to catch up when its view of the peers lags the releaser's (the
	// sidecar plans at every change of peers and at least every retry
	// period; docs/shards.md), and a retry period for its elector's
	// acquire, which a free Lease's watch event normally makes at once.
	shardTakeover = 2 * retryPeriod
	// shardSteady is the window, before the restart, over which the steady
	// API cost is measured.
	shardSteady = 20 * time.Second
)

// shardLeases are the shard set's Lease names, in order.
func shardLeases() []string {
	var names []string
	for i := range shardCount {
		names = append(names, shardPrefix+strconv.Itoa(i))
	}
	return names
}

// TestShardRollout restarts 3 replicas of the example worker over a shard
// set of 12 Leases, under a load whose every message has a shard key, the
// way kubectl rollout restart does. It asserts that no shard Lease is taken
// from a holder before that holder's term ended without a release between;
// that every holder is a pod of the Deployment and none is gone while a
// Lease names it; that each release is followed by a new holder within
// shardTakeover; that no message is lost or applied twice; and that no two
// pods work messages of one shard at once (from the queue's delivery
// history: claim → completion or hand-back intervals of one shard by two
// workers never overlap, and every claim ended, which a completion refused
// for a stale fencing token would not). The figures are logged, and
// written to $HANDOFF_E2E_SHARD_FIGURES if set (e2e/shard-figures.sh).
func TestShardRollout(t *testing.T) {
	ctx := context.Background()
	const name = "shards"
	names := shardLeases()
	shardSet := fmt.Sprintf("%s{0..%d}", shardPrefix, shardCount-1)

	// The apiserver's Lease requests without the Deployment: the kubelet's
	// node Lease (the recorder's list and watch are made before).
	rec := recordShards(t, name, names)
	bgFrom, bgAt := leaseRequests(t), time.Now()
	time.Sleep(10 * time.Second)
	bgTo := leaseRequests(t)
	background := (bgTo - bgFrom) / time.Since(bgAt).Minutes()

	d := worker(name, shardReplicas, rolloutGrace, "--visibility-timeout", rolloutVisibility.String())
	annotate(d, "handoff.dev/shards", shardSet)
	annotate(d, "handoff.dev/shard-peers", "app="+name)
	deploy(t, d)
	before, err := queue.Check(ctx, cluster.pool)
	if err != nil {
		t.Fatal(err)
	}
	load := startShardLoad(t, name, names)
	rec.waitSettled(t, shardReplicas, time.Minute, "before the restart")

	// Steady state: the Lease requests of the pods holding their share.
	steadyFrom, steadyAt, steadyWrites := leaseRequests(t), time.Now(), rec.writes()
	time.Sleep(shardSteady)
	steady := costOf(leaseRequests(t)-steadyFrom, rec.writes()-steadyWrites, time.Since(steadyAt), background)

	old := podNames(t, name)
	alerts := promBefore(t)
	rolloutFrom, rolloutAt, rolloutWrites := leaseRequests(t), time.Now(), rec.writes()
	rec.start(rolloutAt)
	restart := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"e2e/restartedAt":%q}}}}}`, rolloutAt.Format(time.RFC3339Nano))
	if _, err := cluster.kube.AppsV1().Deployments(namespace).Patch(ctx, name, types.StrategicMergePatchType, []byte(restart), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRollout(t, name, 3*time.Minute)
	rec.waitSettled(t, shardReplicas, time.Minute, "after the rollout")
	end := time.Now()
	rec.stop(end)
	rollout := costOf(leaseRequests(t)-rolloutFrom, rec.writes()-rolloutWrites, end.Sub(rolloutAt), background)
	load.end()

	report := checkQueue(t, rolloutVisibility+30*time.Second)
	run := &shardRun{
		replaced: len(old), enqueued: int(load.enqueued.Load()), before: before, report: report,
		steady: steady, rollout: rollout, background: background, window: end.Sub(rolloutAt),
	}
	rec.mu.Lock()
	for _, pod := range old {
		if s := rec.pods[pod]; s == nil || s.terminating.IsZero() {
			t.Errorf("pod %s: its termination was not seen", pod)
		}
	}
	rec.mu.Unlock()
	// A clean rollout: a real Prometheus read each old pod's shutdown and
	// no alert fired (no drain here reaches its deadline).
	if deadline := checkRolloutSeen(t, alerts, old); len(deadline) > 0 {
		t.Errorf("pods %v reached their drain deadline in the shard rollout, whose work is short", deadline)
	}
	rec.checkHolders(t, name, end)
	run.moves, run.toOld, run.again, run.longestFree, run.freeShard = rec.movesAndGaps(t, rolloutAt, end, old)
	run.mostHeld, run.mostHeldPod, run.worstExcess = rec.mostHeld, rec.mostHeldPod, rec.worst
	run.overlaps, run.open, run.intervals = checkShardWork(t, name)
	if run.overlaps > 0 || run.open > 0 {
		t.Errorf("messages of one shard worked by two pods at once: %d overlapping claim intervals of different pods, %d claims never completed nor handed back",
			run.overlaps, run.open)
	}

	figures := run.figures()
	t.Log("\n" + figures)
	if path := os.Getenv("HANDOFF_E2E_SHARD_FIGURES"); path != "" {
		if err := os.WriteFile(path, []byte(figures), 0o644); err != nil {
			t.Error(err)
		}
	}
	// The rollout never has fewer than shardReplicas pods up (a new pod is
	// Ready before an old one goes), and a pod takes no more than its
	// share, even while it sheds: none holds more than ceil(N/replicas).
	// Checked last, so that what it logs on failure ends the output.
	if fair := (shardCount + shardReplicas - 1) / shardReplicas; run.mostHeld > fair {
		rec.logAround(t, rec.mostHeldPod, rec.mostHeldAt)
		t.Errorf("pod %s held %d shards at once (%v at %s), over ceil(%d/%d) = %d", run.mostHeldPod, run.mostHeld, rec.mostHeldOf,
			rec.mostHeldAt.Format("15:04:05.000"), shardCount, shardReplicas, fair)
	}
}

// startShardLoad enqueues shardLoadRate messages a second until the test
// ends or end is called, message i of shard names[i % len(names)], its
// dedup key prefix/shard/i; work as shortWork.
func startShardLoad(t *testing.T, prefix string, names []string) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{stop: cancel}
	t.Cleanup(l.end)
	l.wg.Go(func() {
		tick := time.NewTicker(time.Second / shardLoadRate)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			shard := names[i%len(names)]
			msgs := []queue.Message{{DedupKey: fmt.Sprintf("%s/%s/%d", prefix, shard, i), Amount: int64(i%7 + 1), WorkMillis: shortWork(i), Shard: shard}}
			if err := queue.Enqueue(ctx, cluster.pool, msgs); err != nil {
				if ctx.Err() == nil {
					t.Errorf("enqueue: %v", err)
				}
				return
			}
			l.enqueued.Add(1)
		}
	})
	return l
}

// shardRecorder keeps what two informers saw of one Deployment's pods and
// its shard Leases, each stamped with the time this process received it,
// and, between start and stop, the largest share of the shards a pod held.
type shardRecorder struct {
	mu      sync.Mutex
	shards  []string
	holders map[string][]holderSeen // by shard Lease
	current map[string]string       // holder identity now, by shard Lease
	pods    map[string]*podSeen
	up      map[string]bool // sidecar.PeerUp now, by pod
	ups     []upSeen        // each change of a pod's up, in order
	updates int             // shard Lease writes seen (creates and updates)

	measuring bool
	// mostHeld is the most shards one pod held at once, by mostHeldPod;
	// worst is the largest excess of an up pod's shards over ceil(N/M) for
	// the M pods up at that observation.
	mostHeld    int
	mostHeldPod string
	mostHeldAt  time.Time
	mostHeldOf  []string // the shard Leases naming mostHeldPod then
	worst       shareSeen
}

// upSeen is a change of one pod's sidecar.PeerUp, as the recorder saw it.
type upSeen struct {
	at  time.Time
	pod string
	up  bool
}

// shareSeen is one pod's share of the shards at one observation.
type shareSeen struct {
	at         time.Time
	pod        string
	held, fair int // shards held, ceil(N/M)
	up         int // M
}

// recordShards starts informers on the pods labelled app=app and on the
// Leases of the namespace (keeping those named in shards), until the test
// ends.
func recordShards(t *testing.T, app string, shards []string) *shardRecorder {
	r := &shardRecorder{shards: shards, holders: map[string][]holderSeen{}, current: map[string]string{},
		pods: map[string]*podSeen{}, up: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pods := informers.NewSharedInformerFactoryWithOptions(cluster.kube, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = "app=" + app }))
	leases := informers.NewSharedInformerFactoryWithOptions(cluster.kube, 0, informers.WithNamespace(namespace))
	_, _ = pods.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.pod(o, false) },
		UpdateFunc: func(_, o any) { r.pod(o, false) },
		DeleteFunc: func(o any) { r.pod(o, true) },
	})
	_, _ = leases.Coordination().V1().Leases().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    r.lease,
		UpdateFunc: func(_, o any) { r.lease(o) },
	})
	pods.Start(ctx.Done())
	leases.Start(ctx.Done())
	syncCtx, synced := context.WithTimeout(ctx, 30*time.Second)
	defer synced()
	for _, f := range []informers.SharedInformerFactory{pods, leases} {
		for typ, ok := range f.WaitForCacheSync(syncCtx.Done()) {
			if !ok {
				t.Fatalf("the informer on %v did not sync within 30s", typ)
			}
		}
	}
	return r
}

func (r *shardRecorder) pod(o any, deleted bool) {
	now := time.Now()
	p, ok := informerPod(o)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.pods[p.Name]
	if s == nil {
		s = &podSeen{name: p.Name}
		r.pods[p.Name] = s
	}
	if p.DeletionTimestamp != nil && s.terminating.IsZero() {
		s.terminating, s.deadline = now, p.DeletionTimestamp.Time
	}
	if deleted && s.gone.IsZero() {
		s.gone = now
	}
	up := !deleted && sidecar.PeerUp(p)
	if up != r.up[p.Name] || len(r.ups) == 0 {
		r.ups = append(r.ups, upSeen{at: now, pod: p.Name, up: up})
	}
	r.up[p.Name] = up
	r.observeLocked(now)
}

func (r *shardRecorder) lease(o any) {
	now := time.Now()
	l, ok := o.(*coordinationv1.Lease)
	if !ok || !slices.Contains(r.shards, l.Name) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	h := holderSeen{at: now, holder: ptr.Deref(l.Spec.HolderIdentity, "")}
	if l.Spec.RenewTime != nil {
		h.renewed = l.Spec.RenewTime.Time
	}
	h.duration = time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second
	r.holders[l.Name] = append(r.holders[l.Name], h)
	r.current[l.Name] = h.holder
	r.updates++
	r.observeLocked(now)
}

// observeLocked updates the largest shares, while measuring. A pod holds
// a shard Lease that names it and has not expired at now (its last renewal
// seen plus its lease duration): a Lease its holder stopped renewing
// without a release still names it until another pod takes it, but no one
// leads it once it has expired.
func (r *shardRecorder) observeLocked(now time.Time) {
	if !r.measuring {
		return
	}
	held := map[string][]string{} // pod → the shard Leases it holds, in order
	for _, s := range r.shards {
		hs := r.holders[s]
		if len(hs) == 0 {
			continue
		}
		if h := hs[len(hs)-1]; h.holder != "" && now.Before(h.renewed.Add(h.duration)) {
			held[podOf(h.holder)] = append(held[podOf(h.holder)], s)
		}
	}
	up := 0
	for _, u := range r.up {
		if u {
			up++
		}
	}
	for pod, leases := range held {
		n := len(leases)
		if n > r.mostHeld {
			r.mostHeld, r.mostHeldPod, r.mostHeldAt, r.mostHeldOf = n, pod, now, leases
		}
		if !r.up[pod] || up == 0 {
			continue // a pod being deleted holds its shards until its drain ends
		}
		fair := (len(r.shards) + up - 1) / up
		if n-fair > r.worst.held-r.worst.fair || r.worst.pod == "" {
			r.worst = shareSeen{at: now, pod: pod, held: n, fair: fair, up: up}
		}
	}
}

func (r *shardRecorder) start(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.measuring = true
	r.observeLocked(at)
}

func (r *shardRecorder) stop(time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.measuring = false
}

// logAround logs, for a failure, what the recorder saw in the 20 seconds
// before at: the pods' states, the writes of the shard Leases pod held, and
// pod's Events (they outlive the pod).
func (r *shardRecorder) logAround(t *testing.T, pod string, at time.Time) {
	t.Helper()
	r.mu.Lock()
	for _, p := range r.pods {
		t.Logf("pod %s: terminating %s, gone %s, up now %t", p.name, p.terminating.Format("15:04:05.000"), p.gone.Format("15:04:05.000"), r.up[p.name])
	}
	for _, u := range r.ups {
		if u.at.After(at.Add(-20*time.Second)) && !u.at.After(at.Add(time.Second)) {
			t.Logf("%s pod %s up %t", u.at.Format("15:04:05.000"), u.pod, u.up)
		}
	}
	// A line per shard Lease: its changes of holder in the window, and its
	// last renewal seen by at.
	for _, s := range r.mostHeldOf {
		var b strings.Builder
		from := at.Add(-20 * time.Second)
		var last holderSeen
		for i, h := range r.holders[s] {
			if h.at.After(at.Add(time.Second)) {
				break
			}
			if h.at.After(from) && (i == 0 || h.holder != r.holders[s][i-1].holder) {
				fmt.Fprintf(&b, " %s→%q", h.at.Format("15:04:05.000"), h.holder)
			}
			if !h.at.After(from) {
				b.Reset()
				fmt.Fprintf(&b, " %q at %s", h.holder, from.Format("15:04:05.000"))
			}
			last = h
		}
		t.Logf("%s:%s; last renewed %s (lease duration %s)", s, b.String(), last.renewed.Format("15:04:05.000"), last.duration)
	}
	r.mu.Unlock()
	all, _ := podEvents(t, pod)
	slices.SortFunc(all, func(a, b corev1.Event) int { return a.LastTimestamp.Compare(b.LastTimestamp.Time) })
	for _, e := range all {
		if e.Source.Component == "kubelet" || e.Source.Component == "default-scheduler" {
			continue // the pod's start and stop
		}
		t.Logf("event %s ×%d %s: %s", e.LastTimestamp.Format("15:04:05"), e.Count, e.Reason, e.Message)
	}
	// The sidecar's log, while the pod is there (the kubelet removes it
	// with the pod): its lines on sheds.
	logs, err := cluster.kube.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: inject.SidecarName}).DoRaw(context.Background())
	if err != nil {
		t.Logf("sidecar log of %s: %v", pod, err)
		return
	}
	for line := range strings.Lines(string(logs)) {
		if strings.Contains(line, "shed") || strings.Contains(line, "freed") {
			t.Logf("sidecar %s: %s", pod, strings.TrimSpace(line))
		}
	}
}

// writes is how many writes of the shard Leases the informer has seen.
func (r *shardRecorder) writes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.updates
}

// waitSettled waits up to timeout for the shard set to be shared out over
// replicas pods that are up: every shard held by one of them, none holding
// more than ceil(N/replicas), and no other pod of the Deployment left.
func (r *shardRecorder) waitSettled(t *testing.T, replicas int, timeout time.Duration, when string) {
	t.Helper()
	fair := (len(r.shards) + replicas - 1) / replicas
	var state string
	kubetest.WaitFor(t, timeout, "the shard set to be shared out over the pods up "+when, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		held := map[string]int{}
		ok := true
		for _, s := range r.shards {
			h := podOf(r.current[s])
			if h == "" || !r.up[h] {
				ok = false
				continue
			}
			held[h]++
		}
		up := 0
		for pod, u := range r.up {
			if u {
				up++
			} else if p := r.pods[pod]; p != nil && p.gone.IsZero() {
				ok = false // a pod not up, not gone
			}
		}
		for _, n := range held {
			if n > fair {
				ok = false
			}
		}
		state = fmt.Sprint(held)
		return ok && up == replicas
	})
	t.Logf("shards held %s: %s", when, state)
}

// checkHolders fails the test where a shard Lease was taken from a holder
// whose term had not ended with no release between (recorder.checkTerms),
// held by a pod not of the Deployment, or still named a pod when it was
// gone (before until: the Deployment's deletion at the end releases all).
func (r *shardRecorder) checkHolders(t *testing.T, app string, until time.Time) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.shards {
		one := &recorder{holders: r.holders[s]}
		one.checkTerms(t, s)
		for _, o := range r.holders[s] {
			if o.holder != "" && r.pods[podOf(o.holder)] == nil {
				t.Errorf("%s: shard Lease %s held by %q, not a pod of %s", o.at.Format("15:04:05.000"), s, o.holder, app)
			}
		}
		for _, p := range r.pods {
			if !p.gone.IsZero() && p.gone.Before(until) && podOf(one.holderAtLocked(p.gone)) == p.name {
				t.Errorf("%s: pod %s gone while shard Lease %s still named it", p.gone.Format("15:04:05.000"), p.name, s)
			}
		}
	}
}

// movesAndGaps counts, in [from, until], the shards' changes of holder
// pod, and asserts that each release (the Lease seen free) was followed by
// a holder within shardTakeover; it returns the moves, of them the moves to
// one of the pods old (the ones the rollout replaces), the shards moved
// more than once, the longest time a shard had no holder (seen free, or
// naming a pod that was gone) and that shard.
func (r *shardRecorder) movesAndGaps(t *testing.T, from, until time.Time, old []string) (moves, toOld, again int, longest time.Duration, shard string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.shards {
		last := "" // the last holder pod
		moved := 0
		var noneSince time.Time
		for _, o := range r.holders[s] {
			if o.at.After(until) {
				break
			}
			pod := podOf(o.holder)
			// Naming a pod gone by now: no holder since it went.
			if p := r.pods[last]; p != nil && !p.gone.IsZero() && p.gone.Before(o.at) && noneSince.IsZero() {
				noneSince = p.gone
			}
			switch {
			case pod == "":
				if noneSince.IsZero() {
					noneSince = o.at
				}
				continue
			case pod != last:
				if last != "" && !o.at.Before(from) {
					moves++
					moved++
					if slices.Contains(old, pod) {
						toOld++
					}
					if moved == 2 {
						again++
					}
				}
				last = pod
			}
			if !noneSince.IsZero() {
				if gap := o.at.Sub(noneSince); !o.at.Before(from) {
					if gap > longest {
						longest, shard = gap, s
					}
					if gap > shardTakeover {
						t.Errorf("shard %s: no holder from %s until %s took it at %s (%s); want a holder within %s",
							s, noneSince.Format("15:04:05.000"), o.holder, o.at.Format("15:04:05.000"), gap.Round(time.Millisecond), shardTakeover)
					}
				}
				noneSince = time.Time{}
			}
		}
		if !noneSince.IsZero() {
			t.Errorf("shard %s: no holder since %s", s, noneSince.Format("15:04:05.000"))
		}
	}
	return moves, toOld, again, longest, shard
}

// workInterval is one claim of a message of a shard by a worker, until that
// worker completed it or handed it back.
type workInterval struct {
	shard, worker string
	from, to      time.Time
	message       int64
}

// checkShardWork reads the delivery history of the messages of app's load
// and returns how many claim intervals of a shard overlapped one of
// another worker on the same shard (logging the first few), how many
// claims never ended (neither completed nor handed back by their worker:
// what a completion refused for a stale fencing token leaves, as it writes
// nothing), and how many intervals there were. The times are PostgreSQL's
// clock_timestamp() of each record, on one clock.
func checkShardWork(t *testing.T, app string) (overlaps, open, total int) {
	t.Helper()
	rows, err := cluster.pool.Query(context.Background(), `
SELECT d.message_id, d.worker, d.outcome, d.at, p.dedup_key
FROM handoff_deliveries d JOIN handoff_processed p ON p.message_id = d.message_id
WHERE p.dedup_key LIKE $1 ORDER BY d.at, d.id`, app+"/%")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	type key struct {
		message int64
		worker  string
	}
	opened := map[key]*workInterval{}
	var done []*workInterval
	for rows.Next() {
		var (
			id                   int64
			worker, outcome, ded string
			at                   time.Time
		)
		if err := rows.Scan(&id, &worker, &outcome, &at, &ded); err != nil {
			t.Fatal(err)
		}
		k := key{id, worker}
		switch outcome {
		case queue.OutcomeClaimed:
			if prev := opened[k]; prev != nil {
				open++ // claimed again by the same worker without an end
				t.Logf("message %d (%s): claimed again by %s at %s, its claim of %s never ended", id, ded, worker, at.Format("15:04:05.000"), prev.from.Format("15:04:05.000"))
			}
			opened[k] = &workInterval{shard: strings.Split(ded, "/")[1], worker: worker, from: at, message: id}
		case queue.OutcomeApplied, queue.OutcomeDuplicate, queue.OutcomeReturned, queue.OutcomeHandedBack:
			if w := opened[k]; w != nil {
				w.to = at
				done = append(done, w)
				delete(opened, k)
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for k, w := range opened {
		open++
		t.Logf("message %d of shard %s: claimed by %s at %s, never completed nor handed back by it", k.message, w.shard, w.worker, w.from.Format("15:04:05.000"))
	}
	// Per shard, by start: an interval overlaps another worker's when it
	// starts before the latest end of that worker's earlier intervals.
	sort.Slice(done, func(i, j int) bool { return done[i].from.Before(done[j].from) })
	ends := map[string]map[string]*workInterval{} // shard → worker → its interval ending last so far
	for _, w := range done {
		byWorker := ends[w.shard]
		if byWorker == nil {
			byWorker = map[string]*workInterval{}
			ends[w.shard] = byWorker
		}
		for other, o := range byWorker {
			if other != w.worker && o.to.After(w.from) {
				overlaps++
				if overlaps <= 5 {
					t.Logf("shard %s: %s claimed message %d at %s while %s worked message %d (claimed %s, ended %s)", w.shard, w.worker, w.message,
						w.from.Format("15:04:05.000"), other, o.message, o.from.Format("15:04:05.000"), o.to.Format("15:04:05.000"))
				}
			}
		}
		if o := byWorker[w.worker]; o == nil || w.to.After(o.to) {
			byWorker[w.worker] = w
		}
	}
	return overlaps, open, len(done)
}

// leaseRequests is the sum of the apiserver's apiserver_request_total over
// the requests on resource leases (every verb, code and scope), from its
// /metrics.
func leaseRequests(t *testing.T) float64 {
	t.Helper()
	raw, err := cluster.kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatalf("reading the apiserver's /metrics: %v", err)
	}
	var sum float64
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `resource="leases"`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("apiserver_request_total: %q: %v", line, err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return sum
}

// apiCost is the Lease requests of a window, per pod per minute.
type apiCost struct {
	requests float64 // apiserver_request_total on leases, less the background
	writes   float64 // writes of the shard Leases seen on the watch
}

// costOf is requests and writes over window, per pod of shardReplicas per
// minute, the requests less background (per minute).
func costOf(requests float64, writes int, window time.Duration, background float64) apiCost {
	m := window.Minutes()
	return apiCost{
		requests: (requests - background*m) / shardReplicas / m,
		writes:   float64(writes) / shardReplicas / m,
	}
}

// shardRun is what TestShardRollout measured.
type shardRun struct {
	replaced, enqueued int
	before, report     queue.Report
	moves              int
	toOld, again       int // moves to a pod the rollout replaced; shards moved more than once
	longestFree        time.Duration
	freeShard          string
	mostHeld           int
	mostHeldPod        string
	worstExcess        shareSeen
	overlaps, open     int
	intervals          int
	steady, rollout    apiCost
	background         float64 // Lease requests a minute without the Deployment
	window             time.Duration
}

func (r *shardRun) figures() string {
	var b strings.Builder
	fair := (shardCount + shardReplicas - 1) / shardReplicas
	fmt.Fprintf(&b, "kubectl rollout restart of %d replicas over a shard set of %d Leases; grace period %ds; load %d messages/s spread over the shards; retry period %s\n",
		shardReplicas, shardCount, rolloutGrace, shardLoadRate, retryPeriod)
	fmt.Fprintf(&b, `  shards moved         changes of a shard's holder pod from the restart until the shards were shared out over the new pods
                       (the least possible: every shard once, %d per replaced pod, to a pod of the new revision);
                       beside it, the moves to an old pod (one the rollout deletes later) and the shards moved more than once
  no holder            a shard Lease seen free, or naming a pod already gone, until a pod was seen holding it
  largest share        the most shards one pod held at once (Leases naming it, not expired; a pod being deleted keeps its shards
                       until its drain ends), and
                       the largest excess of an up pod's shards over ceil(N/M) for the M pods up (Running, Ready, not deleted)
  API requests         apiserver_request_total on resource leases (every verb) read from the apiserver's /metrics before and after,
                       less the rate of the same counter before the Deployment existed (%.0f a minute: the kubelet's node
                       Lease), divided by %d pods and the minutes; it includes the pods' one leader Lease (shards-leader,
                       renewed by its one holder). Beside it, the writes of the 12 shard Leases seen on the test's watch.

`, shardCount/r.replaced, r.background, shardReplicas)
	tw := tabwriter.NewWriter(&b, 0, 0, 3, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("rollout (restart to shards shared out again)", secs(r.window))
	row("shards moved (per replaced pod)", fmt.Sprintf("%d (%.1f; least %d)", r.moves, float64(r.moves)/float64(r.replaced), shardCount/r.replaced))
	row("of them to a pod the rollout replaced / shards moved twice or more", fmt.Sprintf("%d / %d (least 0 / 0)", r.toOld, r.again))
	row("longest time a shard had no holder", fmt.Sprintf("%s (%s; bound %s)", ms(r.longestFree), r.freeShard, shardTakeover))
	row("largest share held by one pod", fmt.Sprintf("%d (%s) against ceil(%d/%d) = %d", r.mostHeld, r.mostHeldPod, shardCount, shardReplicas, fair))
	if w := r.worstExcess; w.pod != "" {
		row("largest excess of an up pod over ceil(N/M)", fmt.Sprintf("%+d: %d held against ceil(%d/%d) = %d (%s at %s)", w.held-w.fair, w.held, shardCount, w.up, w.fair, w.pod, w.at.Format("15:04:05.000")))
	}
	row("Lease requests per pod per minute, steady", fmt.Sprintf("%.0f (shard Lease writes %.0f)", r.steady.requests, r.steady.writes))
	row("Lease requests per pod per minute, rollout", fmt.Sprintf("%.0f (shard Lease writes %.0f)", r.rollout.requests, r.rollout.writes))
	row("claim intervals of one shard by two pods overlapping", fmt.Sprintf("%d of %d (claims never ended: %d)", r.overlaps, r.intervals, r.open))
	a, c := r.before, r.report
	lost := (c.Enqueued - a.Enqueued) - (c.Applied - a.Applied) - (c.Pending - a.Pending)
	double := (c.Total - a.Total) + (c.PendingTotal - a.PendingTotal) - (c.WantTotal - a.WantTotal)
	row("messages lost / applied twice", fmt.Sprintf("%d / %d", lost, double))
	row("messages enqueued", strconv.Itoa(r.enqueued))
	_ = tw.Flush()
	return b.String()
}
