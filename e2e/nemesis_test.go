//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/internal/nemesis"
)

// The nemesis's workload: two Deployments of the example worker, each with
// its role Lease, sharing the queue, under a steady load with rollouts and
// scale changes going on.
const (
	nemesisGrace      = 15 // seconds
	nemesisVisibility = 30 * time.Second
	nemesisLoad       = 10 // messages a second
	// The sidecars' defaults, which the checker holds the Leases to.
	nemesisLeaseDuration = 15 * time.Second
	nemesisRetryPeriod   = 2 * time.Second
)

var nemesisApps = []struct {
	name     string
	replicas int32
}{{"nem-a", 3}, {"nem-b", 2}}

// nemesisShortSeeds are TestNemesisShort's: CI's fixed set.
var nemesisShortSeeds = []uint64{1, 2}

// TestNemesisShort runs the nemesis (runNemesis) on nemesisShortSeeds, 6
// faults in a 60 s window each: CI's short nemesis, about 5 minutes of
// make e2e. The long run is e2e/nemesis.sh (make nemesis); its runNemesis
// is the same, and 30 schedules of it passed on 2026-12-07
// (docs/reliability.md, Nemesis).
func TestNemesisShort(t *testing.T) {
	runNemesis(t, nemesisShortSeeds, 60*time.Second, 6, nemesis.Kinds)
}

// TestNemesis runs the nemesis for e2e/nemesis.sh (skipped unless
// HANDOFF_E2E_NEMESIS_SEEDS is set): the seeds of
// $HANDOFF_E2E_NEMESIS_SEEDS (a comma-separated list, or FIRST-LAST),
// $HANDOFF_E2E_NEMESIS_FAULTS faults (default 10) in a
// $HANDOFF_E2E_NEMESIS_WINDOW window (a duration, default 2m) each, drawn
// from $HANDOFF_E2E_NEMESIS_KINDS (a comma-separated list of kinds, default
// all). Its summary goes to $HANDOFF_E2E_NEMESIS_OUT if set.
func TestNemesis(t *testing.T) {
	env := os.Getenv("HANDOFF_E2E_NEMESIS_SEEDS")
	if env == "" {
		t.Skip("HANDOFF_E2E_NEMESIS_SEEDS unset (e2e/nemesis.sh, make nemesis)")
	}
	seeds, err := parseSeeds(env)
	if err != nil {
		t.Fatal(err)
	}
	faults := 10
	if s := os.Getenv("HANDOFF_E2E_NEMESIS_FAULTS"); s != "" {
		if faults, err = strconv.Atoi(s); err != nil || faults < 1 {
			t.Fatalf("HANDOFF_E2E_NEMESIS_FAULTS=%q: want a number of faults per schedule, 1 or more", s)
		}
	}
	window := 2 * time.Minute
	if s := os.Getenv("HANDOFF_E2E_NEMESIS_WINDOW"); s != "" {
		if window, err = time.ParseDuration(s); err != nil || window < 10*time.Second {
			t.Fatalf("HANDOFF_E2E_NEMESIS_WINDOW=%q: want a duration of 10s or more, like 2m", s)
		}
	}
	kinds, err := nemesis.ParseKinds(os.Getenv("HANDOFF_E2E_NEMESIS_KINDS"))
	if err != nil {
		t.Fatalf("HANDOFF_E2E_NEMESIS_KINDS: %v", err)
	}
	runNemesis(t, seeds, window, faults, kinds)
}

// parseSeeds parses "1,2,5" or "1-30".
func parseSeeds(s string) ([]uint64, error) {
	if a, b, ok := strings.Cut(s, "-"); ok {
		lo, err1 := strconv.ParseUint(a, 10, 64)
		hi, err2 := strconv.ParseUint(b, 10, 64)
		if err1 != nil || err2 != nil || hi < lo {
			return nil, fmt.Errorf("seeds %q: want FIRST-LAST with FIRST <= LAST, or a comma-separated list", s)
		}
		var seeds []uint64
		for i := lo; i <= hi; i++ {
			seeds = append(seeds, i)
		}
		return seeds, nil
	}
	var seeds []uint64
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("seeds %q: %q is not a number; want FIRST-LAST or a comma-separated list", s, f)
		}
		seeds = append(seeds, n)
	}
	return seeds, nil
}

// runNemesis deploys the workload, and for each seed draws a schedule of
// faults faults in window, runs it under load with rollouts and scale
// changes going on, lets the cluster settle, and checks the history the
// run recorded (nemesis.Check): it fails the test on any violation, printed
// with its seed, its schedule and its slice of the history. It logs the
// figures of each schedule and their sum.
func runNemesis(t *testing.T, seeds []uint64, window time.Duration, faults int, kinds []nemesis.Kind) {
	nodeOnly(t)
	if cluster.runDir == "" {
		t.Skip("needs the cluster's processes on this machine (the cluster e2e/cluster boots)")
	}
	var leases []string
	for _, a := range nemesisApps {
		deploy(t, worker(a.name, a.replicas, nemesisGrace, "--visibility-timeout", nemesisVisibility.String(), "--concurrency", "4"))
		leases = append(leases, a.name+"-leader")
	}
	h := startHistory(t, leases)
	var sum nemesisSum
	for _, seed := range seeds {
		// A schedule takes its window and about 2 minutes more, and TestMain
		// stops the cluster a minute before the deadline: stop
		// before the test's deadline rather than lose the sum.
		if d, ok := t.Deadline(); ok && time.Until(d) < window+4*time.Minute {
			t.Logf("nemesis: stopping before seed %d, %s before the test's deadline", seed, time.Until(d).Round(time.Second))
			break
		}
		s, err := nemesis.Draw(seed, nemesis.Params{Window: window, Faults: faults, Kinds: kinds, LeaseDuration: nemesisLeaseDuration})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("nemesis %s", s)
		fig, injected, violations := runSchedule(t, h, s, leases)
		sum.add(seed, fig, injected, violations)
		for _, v := range violations {
			t.Error(v)
		}
	}
	out := sum.String()
	t.Log("\n" + out)
	if path := os.Getenv("HANDOFF_E2E_NEMESIS_OUT"); path != "" {
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// runSchedule runs s and checks its history.
func runSchedule(t *testing.T, h *history, s nemesis.Schedule, leases []string) (nemesis.Figures, []nemesis.Injected, []nemesis.Violation) {
	ctx := context.Background()
	for _, a := range nemesisApps {
		waitRollout(t, a.name, 3*time.Minute)
	}
	start := time.Now()
	prefix := fmt.Sprintf("nem-%d-%d", s.Seed, start.Unix())
	l := startLoad(t, prefix, nemesisLoad, shortWork)

	// The workload's own changes, at a fixed cadence: a rollout restart of
	// one Deployment, a scale-up, a rollout of the other, a scale back.
	stopChurn := make(chan struct{})
	var churn sync.WaitGroup
	churn.Go(func() {
		tick := time.NewTicker(25 * time.Second)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stopChurn:
				return
			case <-tick.C:
			}
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			var err error
			switch i % 4 {
			case 0, 2:
				name := nemesisApps[i/2%2].name
				patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"e2e/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
				_, err = cluster.kube.AppsV1().Deployments(namespace).Patch(cctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
			case 1:
				err = scale(cctx, nemesisApps[1].name, nemesisApps[1].replicas+1)
			case 3:
				err = scale(cctx, nemesisApps[1].name, nemesisApps[1].replicas)
			}
			cancel()
			if err != nil {
				t.Logf("churn %d: %v (under a fault, maybe)", i, err)
			}
		}
	})

	injected := make([]nemesis.Injected, len(s.Faults))
	var wg sync.WaitGroup
	for i, f := range s.Faults {
		wg.Go(func() {
			time.Sleep(time.Until(start.Add(f.At)))
			injected[i] = injectFault(t, h, f)
			t.Logf("seed %d: %s", s.Seed, injected[i])
		})
	}
	wg.Wait()
	close(stopChurn)
	churn.Wait()
	// Back to the workload's shape, the node schedulable, every rollout done.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	if err := scale(cctx, nemesisApps[1].name, nemesisApps[1].replicas); err != nil {
		t.Errorf("scale %s back: %v", nemesisApps[1].name, err)
	}
	cancel()
	uncordon(t)
	for _, a := range nemesisApps {
		waitRollout(t, a.name, 3*time.Minute)
	}
	// Every heal's bound has passed before the history is read.
	bound := nemesisLeaseDuration + nemesisRetryPeriod + 2*time.Second
	time.Sleep(bound)
	l.end()
	waitPending(prefix, nemesisVisibility+30*time.Second)
	end := time.Now()

	hist, err := h.read(ctx, prefix, start, end, injected)
	if err != nil {
		t.Fatal(err)
	}
	rules := nemesis.Rules{LeaseDuration: nemesisLeaseDuration, RetryPeriod: nemesisRetryPeriod, Slack: 2 * time.Second,
		KubeletSlack: 5 * time.Second, End: end, Leases: leases}
	// The history as read, for a later look or a re-check with another
	// checker: $HANDOFF_E2E_NEMESIS_DUMP/seed-N.json if set.
	if dir := os.Getenv("HANDOFF_E2E_NEMESIS_DUMP"); dir != "" {
		data, err := json.MarshalIndent(struct {
			Schedule nemesis.Schedule
			Rules    nemesis.Rules
			History  nemesis.History
		}{s, rules, hist}, "", " ")
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%d.json", s.Seed)), data, 0o644)
		}
		if err != nil {
			t.Errorf("dump the history of seed %d: %v", s.Seed, err)
		}
	}
	violations, fig := nemesis.Check(hist, rules, s.Seed)
	t.Logf("seed %d: %d messages (%d applied, %d pending), %d Lease moves, %d violations, worst time to a live holder after a heal %s (%s)",
		s.Seed, fig.Messages, fig.Applied, fig.Pending, fig.Moves, len(violations), fig.WorstLive.Round(time.Millisecond), fig.WorstLiveAt)
	return fig, injected, violations
}

// waitPending waits up to timeout for the messages of prefix to be done.
func waitPending(prefix string, timeout time.Duration) {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		var n int
		if err := cluster.pool.QueryRow(context.Background(), `SELECT count(*) FROM handoff_queue WHERE dedup_key LIKE $1`, prefix+"-%").Scan(&n); err == nil && n == 0 {
			return
		}
	}
}

func scale(ctx context.Context, name string, replicas int32) error {
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	_, err := cluster.kube.AppsV1().Deployments(namespace).Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// uncordon makes the node schedulable again (after a node drain).
func uncordon(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes, err := cluster.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("list nodes: %v", err)
		return
	}
	for _, n := range nodes.Items {
		if n.Spec.Unschedulable {
			if out, err := kubectl(ctx, "uncordon", n.Name).CombinedOutput(); err != nil {
				t.Errorf("kubectl uncordon %s: %v: %s", n.Name, err, out)
			}
		}
	}
}

// history records, by watches, every update of the nemesis's Leases and the
// deletions of its pods, each stamped with the time this process received
// it; and marks the pods the nemesis force-deleted.
type history struct {
	mu     sync.Mutex
	leases []nemesis.LeaseUpdate
	pods   map[string]*nemesis.Pod
	forced map[string]bool
	podsOf cache.Indexer // the pods as last seen
	holder map[string]string
}

func startHistory(t *testing.T, leases []string) *history {
	h := &history{pods: map[string]*nemesis.Pod{}, forced: map[string]bool{}, holder: map[string]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var apps []string
	for _, a := range nemesisApps {
		apps = append(apps, a.name)
	}
	f := informers.NewSharedInformerFactoryWithOptions(cluster.kube, 0, informers.WithNamespace(namespace))
	podInf := informers.NewSharedInformerFactoryWithOptions(cluster.kube, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = "app in (" + strings.Join(apps, ",") + ")" }))
	li := f.Coordination().V1().Leases().Informer()
	_, _ = li.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { h.lease(o, leases) },
		UpdateFunc: func(_, o any) { h.lease(o, leases) },
	})
	pi := podInf.Core().V1().Pods().Informer()
	_, _ = pi.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { h.pod(o, false) },
		UpdateFunc: func(_, o any) { h.pod(o, false) },
		DeleteFunc: func(o any) { h.pod(o, true) },
	})
	h.podsOf = pi.GetIndexer()
	f.Start(ctx.Done())
	podInf.Start(ctx.Done())
	syncCtx, synced := context.WithTimeout(ctx, 30*time.Second)
	defer synced()
	for _, fac := range []informers.SharedInformerFactory{f, podInf} {
		for typ, ok := range fac.WaitForCacheSync(syncCtx.Done()) {
			if !ok {
				t.Fatalf("the informer on %v did not sync within 30s", typ)
			}
		}
	}
	return h
}

func (h *history) lease(o any, names []string) {
	now := time.Now()
	l, ok := o.(*coordinationv1.Lease)
	if !ok || !slices.Contains(names, l.Name) {
		return
	}
	u := nemesis.LeaseUpdate{Seen: now, Lease: l.Name, Holder: podOf(ptr.Deref(l.Spec.HolderIdentity, "")),
		Token: int64(ptr.Deref(l.Spec.LeaseTransitions, 0))}
	if l.Spec.AcquireTime != nil {
		u.Acquired = l.Spec.AcquireTime.Time
	}
	if l.Spec.RenewTime != nil {
		u.Renewed = l.Spec.RenewTime.Time
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.leases = append(h.leases, u)
	h.holder[l.Name] = u.Holder
}

func (h *history) pod(o any, deleted bool) {
	now := time.Now()
	p, ok := informerPod(o)
	if !ok {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.pods[p.Name]
	if s == nil {
		s = &nemesis.Pod{Name: p.Name}
		h.pods[p.Name] = s
	}
	if p.DeletionTimestamp != nil && s.Deleting.IsZero() {
		s.Deleting = now
		s.Grace = time.Duration(ptr.Deref(p.DeletionGracePeriodSeconds, 0)) * time.Second
	}
	if deleted && s.Gone.IsZero() {
		s.Gone = now
		if s.Deleting.IsZero() {
			s.Deleting = now
		}
	}
}

// holderOf returns the pod that holds lease as last seen, "" if none.
func (h *history) holderOf(lease string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.holder[lease]
}

// livePods returns the pods of app, as last seen, that are not being
// deleted and whose containers run, by name.
func (h *history) livePods(app string) []*corev1.Pod {
	var ps []*corev1.Pod
	for _, o := range h.podsOf.List() {
		p := o.(*corev1.Pod)
		if p.Labels["app"] == app && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning &&
			containerStatus(p, "worker").ContainerID != "" {
			ps = append(ps, p)
		}
	}
	slices.SortFunc(ps, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return ps
}

// read returns the history of the run of prefix from start to end:
// PostgreSQL's record of its messages and of the leader writes, the
// watch's Lease updates and pod deletions in that time, and the faults.
func (h *history) read(ctx context.Context, prefix string, start, end time.Time, faults []nemesis.Injected) (nemesis.History, error) {
	hist := nemesis.History{Faults: faults}
	rows, err := cluster.pool.Query(ctx, `SELECT e.dedup_key, q.id IS NOT NULL FROM handoff_enqueued e
		LEFT JOIN handoff_queue q USING (dedup_key) WHERE e.dedup_key LIKE $1`, prefix+"-%")
	if err != nil {
		return hist, err
	}
	for rows.Next() {
		var m nemesis.Message
		if err := rows.Scan(&m.Key, &m.Pending); err != nil {
			return hist, err
		}
		hist.Messages = append(hist.Messages, m)
	}
	if err := rows.Err(); err != nil {
		return hist, err
	}
	// A delivery names its message by id: the queue's row while pending,
	// the processed record's once applied.
	rows, err = cluster.pool.Query(ctx, `SELECT coalesce(p.dedup_key, q.dedup_key), d.worker, d.outcome, d.at FROM handoff_deliveries d
		LEFT JOIN handoff_processed p ON p.message_id = d.message_id LEFT JOIN handoff_queue q ON q.id = d.message_id
		WHERE coalesce(p.dedup_key, q.dedup_key) LIKE $1 ORDER BY d.at, d.id`, prefix+"-%")
	if err != nil {
		return hist, err
	}
	for rows.Next() {
		var d nemesis.Delivery
		if err := rows.Scan(&d.Key, &d.Worker, &d.Outcome, &d.At); err != nil {
			return hist, err
		}
		hist.Deliveries = append(hist.Deliveries, d)
	}
	if err := rows.Err(); err != nil {
		return hist, err
	}
	var leases []string
	for _, a := range nemesisApps {
		leases = append(leases, a.name+"-leader")
	}
	rows, err = cluster.pool.Query(ctx, `SELECT lease, token, holder, ran_at, until_at FROM handoff_leader_runs
		WHERE lease = ANY($1) AND ran_at BETWEEN $2 AND $3 ORDER BY ran_at, id`, leases, start, end)
	if err != nil {
		return hist, err
	}
	for rows.Next() {
		var r nemesis.LeaderRun
		var until *time.Time
		if err := rows.Scan(&r.Lease, &r.Token, &r.Holder, &r.At, &until); err != nil {
			return hist, err
		}
		if until != nil {
			r.Until = *until
		}
		hist.Runs = append(hist.Runs, r)
	}
	if err := rows.Err(); err != nil {
		return hist, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, u := range h.leases {
		if !u.Seen.Before(start) && !u.Seen.After(end) {
			hist.Leases = append(hist.Leases, u)
		}
	}
	for _, p := range h.pods {
		if !p.Deleting.IsZero() && !p.Deleting.Before(start) && !p.Deleting.After(end) {
			q := *p
			q.Forced = h.forced[p.Name]
			hist.Pods = append(hist.Pods, q)
		}
	}
	slices.SortFunc(hist.Pods, func(a, b nemesis.Pod) int { return a.Deleting.Compare(b.Deleting) })
	return hist, nil
}

// nemesisSum adds up the schedules' figures.
type nemesisSum struct {
	seeds                             []uint64
	faults                            map[nemesis.Kind]int
	skipped                           int
	messages, applied, pending, moves int
	violations                        int
	worstLive                         time.Duration
	worstLiveAt                       string
	worstSeed                         uint64
	overGrace                         time.Duration
	overGraceAt                       string
	overGraceSeed                     uint64
}

func (s *nemesisSum) add(seed uint64, fig nemesis.Figures, injected []nemesis.Injected, violations []nemesis.Violation) {
	if s.faults == nil {
		s.faults = map[nemesis.Kind]int{}
	}
	s.seeds = append(s.seeds, seed)
	for _, f := range injected {
		if f.Skipped != "" {
			s.skipped++
			continue
		}
		s.faults[f.Kind]++
	}
	s.messages += fig.Messages
	s.applied += fig.Applied
	s.pending += fig.Pending
	s.moves += fig.Moves
	s.violations += len(violations)
	if fig.WorstLive > s.worstLive {
		s.worstLive, s.worstLiveAt, s.worstSeed = fig.WorstLive, fig.WorstLiveAt, seed
	}
	if fig.WorstOverGrace > s.overGrace {
		s.overGrace, s.overGraceAt, s.overGraceSeed = fig.WorstOverGrace, fig.WorstOverGraceAt, seed
	}
}

func (s *nemesisSum) String() string {
	var b strings.Builder
	total := 0
	for _, n := range s.faults {
		total += n
	}
	fmt.Fprintf(&b, "nemesis: %d schedules (seeds %v), %d faults injected (%d skipped: no target at the time)\n", len(s.seeds), s.seeds, total, s.skipped)
	for _, k := range nemesis.Kinds {
		fmt.Fprintf(&b, "  %-20s %d\n", k, s.faults[k])
	}
	fmt.Fprintf(&b, "messages %d (applied once %d, pending %d), Lease moves %d, violations %d\n", s.messages, s.applied, s.pending, s.moves, s.violations)
	fmt.Fprintf(&b, "worst time to a live holder after a heal: %s (seed %d, %s)\n", s.worstLive.Round(time.Millisecond), s.worstSeed, s.worstLiveAt)
	if s.overGrace > 0 {
		fmt.Fprintf(&b, "not promised: a pod gone %s beyond its grace period under a kubelet or containerd restart (seed %d, %s)\n",
			s.overGrace.Round(time.Millisecond), s.overGraceSeed, s.overGraceAt)
	}
	return b.String()
}

// injectFault injects f and returns it as injected, once healed.
func injectFault(t *testing.T, h *history, f nemesis.Fault) nemesis.Injected {
	in := nemesis.Injected{Fault: f}
	app := nemesisApps[f.Target%len(nemesisApps)].name
	lease := app + "-leader"
	// target picks the Lease holder of app, or else a live pod of it.
	target := func() *corev1.Pod {
		ps := h.livePods(app)
		if len(ps) == 0 {
			return nil
		}
		holder := h.holderOf(lease)
		for _, p := range ps {
			if p.Name == holder {
				return p
			}
		}
		return ps[f.Target/len(nemesisApps)%len(ps)]
	}
	skip := func(why string) nemesis.Injected {
		in.Skipped = why
		return in
	}
	var err error
	switch f.Kind {
	case nemesis.APIServerPause, nemesis.EtcdPause:
		name := "kube-apiserver"
		if f.Kind == nemesis.EtcdPause {
			name = "etcd"
		}
		in.Target = name
		pid, err := clusterPID(name)
		if err != nil {
			return skip(err.Error())
		}
		in.Started = time.Now()
		if err := pause(pid, true); err != nil {
			return skip(err.Error())
		}
		time.Sleep(f.Duration)
		err = pause(pid, false)
		in.Healed = time.Now()
		if err != nil && !errors.Is(err, syscall.ESRCH) { // ESRCH: restarted meanwhile
			t.Errorf("SIGCONT %s: %v", name, err)
		}
		return in
	case nemesis.APIServerRestart:
		in.Target = "kube-apiserver"
		in.Started = time.Now()
		if err := restartProcess("kube-apiserver", syscall.SIGKILL); err != nil {
			t.Errorf("restart kube-apiserver: %v", err)
		}
		waitAPIServer(t)
		in.Healed = time.Now()
		return in
	case nemesis.PodAPICut, nemesis.PodNetCut:
		p := target()
		if p == nil {
			return skip("no live pod of " + app)
		}
		in.Target = p.Name
		ns, err := podNetns(p)
		if err != nil {
			return skip(err.Error())
		}
		defer func() { _ = ns.Close() }()
		rules := [][]string{{"OUTPUT", "!", "-o", "lo", "-j", "DROP"}, {"INPUT", "!", "-i", "lo", "-j", "DROP"}}
		if f.Kind == nemesis.PodAPICut {
			rules = [][]string{
				{"OUTPUT", "-d", ownHostIP, "-p", "tcp", "--dport", "6443", "-j", "DROP"},
				{"OUTPUT", "-d", kubernetesServiceIP(), "-p", "tcp", "--dport", "443", "-j", "DROP"},
			}
		}
		in.Started = time.Now()
		for _, r := range rules {
			if err := iptablesIn(ns, append([]string{"-I"}, r...)...); err != nil {
				return skip(err.Error())
			}
		}
		time.Sleep(f.Duration)
		for _, r := range rules {
			// The pod may be gone with its network namespace: nothing to heal.
			_ = iptablesIn(ns, append([]string{"-D"}, r...)...)
		}
		in.Healed = time.Now()
		return in
	case nemesis.SidecarKill, nemesis.SidecarStop, nemesis.WorkerKill:
		p := target()
		if p == nil {
			return skip("no live pod of " + app)
		}
		container := "handoff"
		if f.Kind == nemesis.WorkerKill {
			container = "worker"
		}
		in.Target = p.Name + "/" + container
		sig := "SIGKILL"
		if f.Kind == nemesis.SidecarStop {
			sig = "SIGSTOP"
		}
		in.Started = time.Now()
		if err := signalContainer(p, container, sig); err != nil {
			return skip(err.Error())
		}
		if f.Kind == nemesis.SidecarStop {
			time.Sleep(f.Duration)
			// The kubelet may have restarted it meanwhile (its probe).
			_ = signalContainer(p, container, "SIGCONT")
		}
		in.Healed = time.Now()
		return in
	case nemesis.ForceDelete:
		p := target()
		if p == nil {
			return skip("no live pod of " + app)
		}
		in.Target = p.Name
		h.mu.Lock()
		h.forced[p.Name] = true
		h.mu.Unlock()
		in.Started = time.Now()
		if err := deleteWithin(p.Name, ptr.To[int64](0)); err != nil {
			return skip(err.Error())
		}
		in.Healed = time.Now()
		return in
	case nemesis.PreStopKill, nemesis.KubeletRestart, nemesis.ContainerdRestart:
		// In the middle of a pod's termination: the Lease holder deleted,
		// its preStop hook seen running, then the fault.
		p := target()
		if p == nil {
			return skip("no live pod of " + app)
		}
		in.Target = p.Name
		in.Started = time.Now()
		if err := deleteWithin(p.Name, nil); err != nil {
			return skip(err.Error())
		}
		hook := waitHook(p, 15*time.Second)
		switch f.Kind {
		case nemesis.PreStopKill:
			if hook == 0 {
				return skip("pod " + p.Name + ": no preStop hook process seen within 15s")
			}
			err = syscall.Kill(hook, syscall.SIGKILL)
			in.Target = fmt.Sprintf("%s preStop (pid %d)", p.Name, hook)
		case nemesis.KubeletRestart:
			err = restartProcess("kubelet", syscall.SIGTERM)
			in.Target = p.Name + " terminating; kubelet"
		case nemesis.ContainerdRestart:
			err = restartProcess("containerd", syscall.SIGTERM)
			in.Target = p.Name + " terminating; containerd"
		}
		if err != nil {
			t.Errorf("%s: %v", f.Kind, err)
		}
		in.Healed = time.Now()
		return in
	case nemesis.NodeDrain:
		// During a rollout of app: evict its pods (cordon and drain), then
		// uncordon.
		in.Target = app
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"e2e/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
		in.Started = time.Now()
		if _, err := cluster.kube.AppsV1().Deployments(namespace).Patch(ctx, app, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return skip(err.Error())
		}
		out, err := kubectl(ctx, "drain", "127.0.0.1", "--pod-selector", "app="+app, "--delete-emptydir-data", "--ignore-daemonsets", "--timeout", "90s").CombinedOutput()
		if err != nil {
			t.Logf("kubectl drain (app %s): %v: %s", app, err, out)
		}
		out, err = kubectl(ctx, "uncordon", "127.0.0.1").CombinedOutput()
		if err != nil {
			t.Errorf("kubectl uncordon: %v: %s", err, out)
		}
		// Healed once the node has the Deployment's pods back: until then
		// none of them can hold the Lease.
		if err := rolledOut(ctx, app); err != nil {
			t.Logf("node drain of %s: %v", app, err)
		}
		in.Healed = time.Now()
		return in
	}
	return skip("unknown kind")
}

// paused counts the pauses under way of each process: overlapping pauses
// of one process end with the last of them.
var paused = struct {
	sync.Mutex
	n map[int]int
}{n: map[int]int{}}

// pause sends SIGSTOP to pid at its first pause (stop) and SIGCONT at the
// end of its last (!stop).
func pause(pid int, stop bool) error {
	paused.Lock()
	defer paused.Unlock()
	if stop {
		paused.n[pid]++
		if paused.n[pid] > 1 {
			return nil
		}
		err := syscall.Kill(pid, syscall.SIGSTOP)
		if err != nil {
			paused.n[pid]--
		}
		return err
	}
	paused.n[pid]--
	if paused.n[pid] > 0 {
		return nil
	}
	return syscall.Kill(pid, syscall.SIGCONT)
}

// rolledOut waits until ctx ends for Deployment app to have all its
// replicas updated and available: waitRollout for a goroutine.
func rolledOut(ctx context.Context, app string) error {
	for ; ctx.Err() == nil; time.Sleep(200 * time.Millisecond) {
		d, err := cluster.kube.AppsV1().Deployments(namespace).Get(ctx, app, metav1.GetOptions{})
		if err == nil && d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == *d.Spec.Replicas &&
			d.Status.AvailableReplicas == *d.Spec.Replicas {
			return nil
		}
	}
	return fmt.Errorf("deployment %s not rolled out: %w", app, ctx.Err())
}

// deleteWithin deletes pod with grace (nil: the pod's own), giving up after
// 20 s (the API server may be paused).
func deleteWithin(pod string, grace *int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return cluster.kube.CoreV1().Pods(namespace).Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: grace})
}

// waitAPIServer waits up to a minute for the API server to answer /readyz.
func waitAPIServer(t *testing.T) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := cluster.kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil {
			return
		}
	}
	t.Errorf("kube-apiserver not ready a minute after its restart")
}

// clusterPID is the PID of the cluster's process name (etcd,
// kube-apiserver, kubelet, containerd): the last one up.sh or a restart
// recorded in the cluster's pids.
func clusterPID(name string) (int, error) {
	data, err := os.ReadFile(filepath.Join(cluster.runDir, "pids"))
	if err != nil {
		return 0, err
	}
	pid := 0
	for line := range strings.Lines(string(data)) {
		p, n, _ := strings.Cut(strings.TrimSpace(line), " ")
		if n == name {
			pid, _ = strconv.Atoi(p)
		}
	}
	if pid == 0 {
		return 0, fmt.Errorf("no %s in %s/pids", name, cluster.runDir)
	}
	return pid, nil
}

// restartMu keeps restarts from overlapping each other's pids record.
var restartMu sync.Mutex

// restartProcess stops the cluster's process name with sig (then SIGKILL
// after 10 s) and starts it again with the same command line, environment
// and working directory, its output appended to its log, recorded in the
// cluster's pids for down.sh.
func restartProcess(name string, sig syscall.Signal) error {
	restartMu.Lock()
	defer restartMu.Unlock()
	pid, err := clusterPID(name)
	if err != nil {
		return err
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return err
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return err
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil {
		return err
	}
	args := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
	if err := syscall.Kill(pid, sig); err != nil {
		return err
	}
	for i := 0; syscall.Kill(pid, 0) == nil; i++ {
		if i == 100 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	log, err := os.OpenFile(filepath.Join(cluster.runDir, "logs", name+".log"), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer func() { _ = log.Close() }()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = strings.Split(strings.TrimSuffix(string(environ), "\x00"), "\x00")
	cmd.Dir, cmd.Stdout, cmd.Stderr = cwd, log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() { _ = cmd.Wait() }()
	pids, err := os.OpenFile(filepath.Join(cluster.runDir, "pids"), os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer func() { _ = pids.Close() }()
	_, err = fmt.Fprintf(pids, "%d %s\n", cmd.Process.Pid, name)
	return err
}

// containerID returns the containerd ID of container of p.
func containerID(p *corev1.Pod, container string) (string, error) {
	_, id, ok := strings.Cut(containerStatus(p, container).ContainerID, "containerd://")
	if !ok {
		return "", fmt.Errorf("pod %s: container %s has no containerd ID", p.Name, container)
	}
	return id, nil
}

// signalContainer sends sig to container of p through the node's
// containerd.
func signalContainer(p *corev1.Pod, container, sig string) error {
	id, err := containerID(p, container)
	if err != nil {
		return err
	}
	args := append(slices.Clone(cluster.ctr[1:]), "tasks", "kill", "--signal", sig, id)
	if out, err := exec.Command(cluster.ctr[0], args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ctr tasks kill --signal %s (%s of %s): %w: %s", sig, container, p.Name, err, out)
	}
	return nil
}

// podNetns opens the network namespace of p (through its worker's
// process), to cut and heal its network in even if the worker restarts.
func podNetns(p *corev1.Pod) (*os.File, error) {
	id, err := containerID(p, "worker")
	if err != nil {
		return nil, err
	}
	args := append(slices.Clone(cluster.ctr[1:]), "tasks", "ls")
	out, err := exec.Command(cluster.ctr[0], args...).Output()
	if err != nil {
		return nil, fmt.Errorf("ctr tasks ls: %w", err)
	}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == id {
			return os.Open("/proc/" + f[1] + "/ns/net")
		}
	}
	return nil, fmt.Errorf("pod %s: no task of its worker %s", p.Name, id)
}

// iptablesIn runs iptables with args in the network namespace ns.
func iptablesIn(ns *os.File, args ...string) error {
	cmd := exec.Command("nsenter", append([]string{"--net=/proc/self/fd/3", "iptables", "-w"}, args...)...)
	cmd.ExtraFiles = []*os.File{ns}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables %s in the pod's network namespace: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// kubernetesServiceIP is the kubernetes Service's cluster IP, through which
// pods reach the API server.
func kubernetesServiceIP() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := cluster.kube.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		return "10.96.0.1" // up.sh's SERVICE_IP
	}
	return s.Spec.ClusterIP
}

// waitHook waits up to timeout for the preStop hook (handoff prestop) of
// p's worker to run, and returns its PID on this machine, 0 if not seen.
func waitHook(p *corev1.Pod, timeout time.Duration) int {
	uid := string(p.UID)
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, c := range procs {
			cmdline, err := os.ReadFile(c)
			args := strings.Split(string(cmdline), "\x00")
			if err != nil || len(args) < 2 || !strings.HasSuffix(args[0], "/handoff") || args[1] != "prestop" {
				continue
			}
			cg, err := os.ReadFile(filepath.Join(filepath.Dir(c), "cgroup"))
			if err != nil || !strings.Contains(string(cg), uid) && !strings.Contains(string(cg), strings.ReplaceAll(uid, "-", "_")) {
				continue
			}
			if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(c))); err == nil {
				return pid
			}
		}
	}
	return 0
}
