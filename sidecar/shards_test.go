package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/leaderelection"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/shard"
	"github.com/handoff-dev/handoff/worker"
)

// shardTerms records, from the app API's traffic of every pod, when each
// pod's app led each shard: from the arrival of a grant with a new fencing
// token (counted from before the app applied it) to the end of the answer
// to an acknowledged revoke, or the Until of the last grant when that is
// earlier. Two pods
// leading one shard at once would show as overlapping terms.
type shardTerms struct {
	mu    sync.Mutex
	open  map[string]*shardTerm // pod/shard → its open term
	terms []shardTerm
}

type shardTerm struct {
	pod, shard string
	token      int64
	from, to   time.Time
	until      time.Time
}

func (s *shardTerms) closeLocked(key string, at time.Time) {
	t := s.open[key]
	if t == nil {
		return
	}
	delete(s.open, key)
	t.to = at
	if t.until.Before(at) {
		t.to = t.until
	}
	s.terms = append(s.terms, *t)
}

// wrap records p's shard terms around its app handler.
func (s *shardTerms) wrap(p *pod) {
	inner := *p.app.Load()
	h := http.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var l protocol.Leadership
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if r.Method != http.MethodPut || json.Unmarshal(body, &l) != nil {
			inner.ServeHTTP(w, r)
			return
		}
		key := p.name + "/" + l.Lease
		if l.Leader {
			now := time.Now()
			s.mu.Lock()
			if t := s.open[key]; t != nil && t.token != l.FencingToken {
				s.closeLocked(key, now)
			}
			if s.open[key] == nil {
				s.open[key] = &shardTerm{pod: p.name, shard: l.Lease, token: l.FencingToken, from: now}
			}
			s.open[key].until = l.Until
			s.mu.Unlock()
		}
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		inner.ServeHTTP(sw, r)
		if !l.Leader && sw.code/100 == 2 { // an acknowledged revoke ends the term
			s.mu.Lock()
			s.closeLocked(key, time.Now())
			s.mu.Unlock()
		}
	}))
	p.app.Store(&h)
}

// statusWriter keeps the status code of the answer.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

// overlaps lists every two terms of different pods over one shard that
// overlap in time, closing the open ones now.
func (s *shardTerms) overlaps() []string {
	s.mu.Lock()
	now := time.Now()
	for key := range s.open {
		s.closeLocked(key, now)
	}
	terms := slices.Clone(s.terms)
	s.mu.Unlock()
	var out []string
	for i, a := range terms {
		for _, b := range terms[i+1:] {
			if a.shard == b.shard && a.pod != b.pod && a.from.Before(b.to) && b.from.Before(a.to) {
				out = append(out, fmt.Sprintf("%s led by %s (token %d, %s to %s) and %s (token %d, %s to %s)",
					a.shard, a.pod, a.token, a.from.Format("15:04:05.000"), a.to.Format("15:04:05.000"),
					b.pod, b.token, b.from.Format("15:04:05.000"), b.to.Format("15:04:05.000")))
			}
		}
	}
	return out
}

// longestGap is the longest time from the end of one pod's term over a
// shard to the start of another pod's term over it: how long a moved shard
// had no app leading it, as the apps saw it.
func (s *shardTerms) longestGap() (time.Duration, string) {
	s.mu.Lock()
	terms := slices.Clone(s.terms)
	s.mu.Unlock()
	slices.SortFunc(terms, func(a, b shardTerm) int { return a.from.Compare(b.from) })
	var longest time.Duration
	var which string
	last := map[string]shardTerm{}
	for _, t := range terms {
		if prev, ok := last[t.shard]; ok && prev.pod != t.pod {
			if gap := t.from.Sub(prev.to); gap > longest {
				longest, which = gap, fmt.Sprintf("%s from %s to %s", t.shard, prev.pod, t.pod)
			}
		}
		last[t.shard] = t
	}
	return longest, which
}

// countingTransport counts the requests sent through it.
type countingTransport struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.rt.RoundTrip(r)
}

// shardPod creates a Pod object labelled as a peer of the shard set, Running
// and Ready, and starts its sidecar with a Lease client that counts its
// requests.
func shardPod(t *testing.T, ns, name string, shards int, terms *shardTerms) (*pod, *atomic.Int64) {
	t.Helper()
	n := &atomic.Int64{}
	p := startShardPod(t, ns, name, shards, nil, func(rc *rest.Config) {
		rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt: rt, n: n} })
	})
	terms.wrap(p)
	return p, n
}

// startShardPod creates a Pod object labelled as a peer of the shard set
// (app=shards), Running and Ready, and starts its sidecar over shards
// s-0… at a retry period of 250 ms, with values added to its settings and
// its Lease client's REST config changed by client (nil: as it is).
func startShardPod(t *testing.T, ns, name string, shards int, values map[string]string, client func(*rest.Config)) *pod {
	t.Helper()
	return startLabelledShardPod(t, ns, name, nil, shards, values, client)
}

// startLabelledShardPod is startShardPod with labels added to the Pod's
// (app=shards).
func startLabelledShardPod(t *testing.T, ns, name string, labels map[string]string, shards int, values map[string]string, client func(*rest.Config)) *pod {
	t.Helper()
	env := kubetest.Get(t)
	grace := int64(30)
	all := map[string]string{"app": "shards"}
	maps.Copy(all, labels)
	obj, err := env.Client.CoreV1().Pods(ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: all},
		Spec: corev1.PodSpec{NodeName: "node-1", TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "worker", Image: "worker"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setReady(t, obj, true)
	retry := 250 * time.Millisecond
	budget := leaderelection.ClientBudget(shards, retry)
	rc := rest.CopyConfig(env.Config)
	rc.QPS, rc.Burst = budget.QPS, budget.Burst
	if client != nil {
		client(rc)
	}
	settings := map[string]string{
		"leases": "", "shards": fmt.Sprintf("s-{0..%d}", shards-1), "shard-peers": "app=shards",
		"retry-period": retry.String(),
	}
	maps.Copy(settings, values)
	return startPod(t, obj, settings, worker.Options{}, kubernetes.NewForConfigOrDie(rc).CoordinationV1())
}

// setReady sets the pod's phase Running and its Ready condition, as the
// kubelet would: the conditions it does not own (the sidecar's) stay.
func setReady(t *testing.T, obj *corev1.Pod, ready bool) {
	t.Helper()
	pods := kubetest.Get(t).Client.CoreV1().Pods(obj.Namespace)
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	for {
		cur, err := pods.Get(context.Background(), obj.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Status.Phase = corev1.PodRunning
		cur.Status.Conditions = slices.DeleteFunc(cur.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodReady })
		cur.Status.Conditions = append(cur.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()})
		_, err = pods.UpdateStatus(context.Background(), cur, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue // the sidecar wrote its conditions meanwhile
		}
		if err != nil {
			t.Fatal(err)
		}
		return
	}
}

// holders maps each shard Lease of ns to its holder's pod name ("" when free).
func holders(t *testing.T, ns string, pods []*pod) map[string]string {
	t.Helper()
	list, err := kubetest.Get(t).Client.CoordinationV1().Leases(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byIdentity := map[string]string{}
	for _, p := range pods {
		byIdentity[p.settings.Identity()] = p.name
	}
	out := map[string]string{}
	for _, l := range list.Items {
		h := ""
		if l.Spec.HolderIdentity != nil {
			h = byIdentity[*l.Spec.HolderIdentity]
		}
		out[l.Name] = h
	}
	return out
}

// converged reports whether the shards are settled: every one of the n
// shards is held by a pod of up, each within [floor(N/M), ceil(N/M)] for
// the M pods of up when balanced, every pod of up publishes on its Pod
// (the condition protocol.PodConditionShards) what it holds, and every
// app leads what its pod holds.
func converged(t *testing.T, ns string, n int, all, up []*pod) bool {
	return settled(t, ns, n, all, up, true)
}

func settled(t *testing.T, ns string, n int, all, up []*pod, balanced bool) bool {
	h := holders(t, ns, all)
	shards := shardNames(n)
	load := map[string][]string{}
	for _, s := range shards {
		load[h[s]] = append(load[h[s]], s)
	}
	for _, p := range up {
		held := load[p.name]
		if balanced && (len(held) < n/len(up) || len(held) > shard.Share(n, len(up))) {
			return false
		}
		if got := published(t, ns, p.name, shards); !slices.Equal(got, held) {
			return false
		}
		for _, s := range shards {
			if _, leads := p.agent.Leader(s); leads != slices.Contains(held, s) {
				return false
			}
		}
	}
	held := 0
	for _, p := range up {
		held += len(load[p.name])
	}
	return held == n
}

func shardNames(n int) []string {
	shards := make([]string, n)
	for i := range shards {
		shards[i] = fmt.Sprintf("s-%d", i)
	}
	return shards
}

// published is what pod name says it holds (its condition
// protocol.PodConditionShards), in the order of shards; nil without it.
func published(t *testing.T, ns, name string, shards []string) []string {
	for _, c := range mustGet(t, ns, name).Status.Conditions {
		if c.Type == protocol.PodConditionShards {
			held, err := shard.DecodeHeld(shards, c.Message)
			if err != nil {
				t.Fatalf("pod %s's condition %s: %v", name, c.Type, err)
			}
			return held
		}
	}
	return nil
}

// TestShardsConvergeToTheFairShareAsPodsJoinAndLeave: 12 shards, pods
// joining one by one and one leaving (its deletion starts its sequence):
// after each change the Leases and the apps' leadership converge to the
// assignment for the pods up, at most ceil(N/M) each, and no shard is led
// by two apps at any moment.
func TestShardsConvergeToTheFairShareAsPodsJoinAndLeave(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	const n = 12
	terms := &shardTerms{open: map[string]*shardTerm{}}
	var all, up []*pod
	counts := map[string]*atomic.Int64{}
	join := func(name string) {
		p, c := shardPod(t, ns, name, n, terms)
		all, up, counts[name] = append(all, p), append(up, p), c
	}
	var last map[string]string
	wait := func(what string) {
		t.Helper()
		kubetest.WaitFor(t, 20*time.Second, what, func() bool { return converged(t, ns, n, all, up) })
		now := holders(t, ns, all)
		moved := 0
		for s, h := range now {
			if last != nil && last[s] != h {
				moved++
			}
		}
		last = now
		t.Logf("%s: %d shards moved, share %d", what, moved, shard.Share(n, len(up)))
		for _, p := range up {
			held := 0
			for _, name := range holders(t, ns, all) {
				if name == p.name {
					held++
				}
			}
			if share := shard.Share(n, len(up)); held > share {
				t.Errorf("%s holds %d shards, over ceil(%d/%d) = %d", p.name, held, n, len(up), share)
			}
		}
		if o := terms.overlaps(); len(o) > 0 {
			t.Fatalf("after %s, shards led by two pods at once:\n%v", what, o)
		}
	}

	join("pod-a")
	wait("pod-a alone to hold all 12 shards")
	join("pod-b")
	wait("6 shards each on pod-a and pod-b")
	join("pod-c")
	wait("4 shards each on pod-a, pod-b and pod-c")

	// /v1/status lists the shards each pod leads.
	for _, p := range up {
		led := 0
		for _, ls := range p.c.Status().Leases {
			if ls.Leader && ls.Kind == protocol.LeaseKindPartition {
				led++
			}
		}
		if led != 4 {
			t.Errorf("%s's status shows %d shards led, want 4: %+v", p.name, led, p.c.Status().Leases)
		}
	}

	// Steady state: the Lease requests of each pod over a few seconds.
	before := map[string]int64{}
	for name, c := range counts {
		before[name] = c.Load()
	}
	start := time.Now()
	time.Sleep(3 * time.Second)
	took := time.Since(start)
	for _, p := range up {
		perMin := float64(counts[p.name].Load()-before[p.name]) / took.Minutes()
		// 4 held shards renewed every 250 ms: 960 a minute, plus little.
		t.Logf("%s: %.0f Lease requests per minute holding 4 shards at retry period 250ms (%.1f per shard per retry period)",
			p.name, perMin, perMin/4/(time.Minute.Seconds()/0.25))
		if perMin > 1.5*4*240 {
			t.Errorf("%s sent %.0f Lease requests a minute holding 4 shards; want about 960", p.name, perMin)
		}
	}

	// pod-b leaves: its deletion starts its sequence, which releases its
	// shards after the drain; the others take them.
	b := up[1]
	if err := env.Client.CoreV1().Pods(ns).Delete(context.Background(), b.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	up = []*pod{up[0], up[2]}
	wait("6 shards each on pod-a and pod-c after pod-b left")
	select {
	case <-b.c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("pod-b's sequence did not end")
	}
	if rep := b.c.Status().Report; rep == nil || len(rep.Errors) > 0 {
		t.Errorf("pod-b's report: %+v", rep)
	}

	// pod-a stops being Ready: it sheds everything to pod-c.
	setReady(t, mustGet(t, ns, "pod-a"), false)
	up = []*pod{up[1]}
	wait("pod-c alone to hold all 12 shards once pod-a is not Ready")
	if got := counter(all[0].metrics.ShardsShed); got < 6 {
		t.Errorf("pod-a's handoff_shards_shed_total = %v, want at least the 6 it held", got)
	}
	if err := all[0].c.Ready(); err != nil {
		t.Errorf("pod-a's readiness depends on its shards: %v", err)
	}
	gap, which := terms.longestGap()
	t.Logf("longest time a moved shard had no app leading it: %s (%s)", gap.Round(time.Millisecond), which)
}

func mustGet(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	p, err := kubetest.Get(t).Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func counter(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// A shed whose revoke the app refuses releases the shard only once the
// app's term has run out, and so does the sequence when the pod is deleted
// during that wait: no shard is led by two apps at once.
func TestUnacknowledgedShedReleasesOnlyAfterTheAppsTerm(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	const n = 4
	terms := &shardTerms{open: map[string]*shardTerm{}}
	a, _ := shardPod(t, ns, "pod-a", n, terms)
	kubetest.WaitFor(t, 20*time.Second, "pod-a alone to lead all 4 shards", func() bool { return converged(t, ns, n, []*pod{a}, []*pod{a}) })
	// pod-a's app answers every revoke with an error at once: its terms
	// go on until their Until.
	var refused atomic.Int64
	inner := *a.app.Load()
	h := http.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var l protocol.Leadership
		if r.Method == http.MethodPut && json.Unmarshal(body, &l) == nil && !l.Leader {
			refused.Add(1)
			http.Error(w, "leader work did not stop", http.StatusInternalServerError)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	a.app.Store(&h)
	b, _ := shardPod(t, ns, "pod-b", n, terms)
	kubetest.WaitFor(t, 10*time.Second, "pod-a to revoke a shard for pod-b", func() bool { return refused.Load() > 0 })
	// Deleted while its sheds wait for the app's terms to end.
	if err := env.Client.CoreV1().Pods(ns).Delete(context.Background(), a.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	kubetest.WaitFor(t, 20*time.Second, "pod-b alone to lead all 4 shards", func() bool { return converged(t, ns, n, []*pod{a, b}, []*pod{b}) })
	if o := terms.overlaps(); len(o) > 0 {
		t.Fatalf("shards led by two pods at once:\n%v", o)
	}
}

// leaseMoves records, from a watch of a namespace's Leases, each change of
// a shard Lease's holder pod (a release, to no holder, is not one).
type leaseMoves struct {
	mu    sync.Mutex
	last  map[string]string // shard → its last holder pod
	moves []leaseMove
}

type leaseMove struct{ shard, from, to string }

// watchMoves starts recording the moves of ns's Leases from their holders
// now; the watch ends with the test.
func watchMoves(t *testing.T, ns string) *leaseMoves {
	t.Helper()
	leases := kubetest.Get(t).Client.CoordinationV1().Leases(ns)
	list, err := leases.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := &leaseMoves{last: map[string]string{}}
	podOf := func(l *coordinationv1.Lease) string {
		pod, _, _ := strings.Cut(ptr.Deref(l.Spec.HolderIdentity, ""), "_")
		return pod
	}
	for i := range list.Items {
		m.last[list.Items[i].Name] = podOf(&list.Items[i])
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := leases.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok || !strings.HasPrefix(l.Name, "s-") {
				continue
			}
			pod := podOf(l)
			m.mu.Lock()
			if pod != "" && pod != m.last[l.Name] {
				if m.last[l.Name] != "" {
					m.moves = append(m.moves, leaseMove{l.Name, m.last[l.Name], pod})
				}
				m.last[l.Name] = pod
			}
			m.mu.Unlock()
		}
	}()
	return m
}

func (m *leaseMoves) all() []leaseMove {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.moves)
}

// TestShardsMoveOnceInARollingUpdate: a rolling update of 3 pods holding
// 12 shards, as a Deployment with maxSurge 1 and maxUnavailable 0 makes it
// (a pod of the new revision created and Ready, then an old one deleted,
// three times): each shard moves once, from its old pod to a pod of the new
// revision, the least possible (4 per replaced pod), and no shard is led by
// two apps at once.
func TestShardsMoveOnceInARollingUpdate(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	const n = 12
	terms := &shardTerms{open: map[string]*shardTerm{}}
	start := func(name, revision string) *pod {
		p := startLabelledShardPod(t, ns, name, map[string]string{"pod-template-hash": revision}, n, nil, nil)
		terms.wrap(p)
		return p
	}
	var all, up []*pod
	for _, name := range []string{"old-a", "old-b", "old-c"} {
		p := start(name, "r1")
		all, up = append(all, p), append(up, p)
	}
	kubetest.WaitFor(t, 20*time.Second, "12 shards shared out over the 3 old pods", func() bool { return converged(t, ns, n, all, up) })
	// The newest revision is the newest pod's, and creation times are whole
	// seconds: the new pods are created at least a second after the old.
	created := mustGet(t, ns, "old-c").CreationTimestamp.Time
	kubetest.WaitFor(t, 3*time.Second, "a second past the old pods' creation", func() bool { return time.Now().After(created.Add(time.Second)) })

	moves := watchMoves(t, ns)
	old := slices.Clone(up)
	for i, o := range old {
		np := start(fmt.Sprintf("new-%c", 'a'+i), "r2")
		all, up = append(all, np), append(up, np)
		// Its plan has run once it has published what it holds: none.
		kubetest.WaitFor(t, 10*time.Second, np.name+" to publish the shards it holds", func() bool {
			return slices.ContainsFunc(mustGet(t, ns, np.name).Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == protocol.PodConditionShards })
		})
		if err := env.Client.CoreV1().Pods(ns).Delete(context.Background(), o.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		up = slices.DeleteFunc(up, func(p *pod) bool { return p == o })
		kubetest.WaitFor(t, 20*time.Second, o.name+"'s shards taken over", func() bool { return settled(t, ns, n, all, up, false) })
		select {
		case <-o.c.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s's sequence did not end", o.name)
		}
	}
	kubetest.WaitFor(t, 20*time.Second, "4 shards each on the new pods", func() bool { return converged(t, ns, n, all, up) })

	got := moves.all()
	per := map[string]int{}
	for _, mv := range got {
		per[mv.shard]++
		if !strings.HasPrefix(mv.from, "old-") || !strings.HasPrefix(mv.to, "new-") {
			t.Errorf("shard %s moved from %s to %s; want from an old pod to a new one", mv.shard, mv.from, mv.to)
		}
	}
	for _, s := range shardNames(n) {
		if per[s] != 1 {
			t.Errorf("shard %s moved %d times; want once", s, per[s])
		}
	}
	t.Logf("rolling update of 3 pods over 12 shards: %d moves, %.1f per replaced pod (least 4)", len(got), float64(len(got))/3)
	if t.Failed() {
		t.Logf("moves: %v", got)
	}
	if o := terms.overlaps(); len(o) > 0 {
		t.Fatalf("shards led by two pods at once:\n%v", o)
	}
}
