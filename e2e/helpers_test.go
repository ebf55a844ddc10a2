//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
)

// faultPort is where pgworker --fault-addr serves its liveness endpoint and
// its faults (examples/pgworker/faults.go), on the pod's IP.
const faultPort = 7460

// withFaults gives d's worker the fault endpoints and, if liveness, a
// liveness probe on them that kills the worker 3 failed probes (about 3 s)
// after POST /fault/unhealthy.
func withFaults(d *appsv1.Deployment, liveness bool) *appsv1.Deployment {
	c := &d.Spec.Template.Spec.Containers[0]
	c.Args = append(c.Args, "--fault-addr", fmt.Sprintf(":%d", faultPort))
	if liveness {
		c.LivenessProbe = &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(faultPort)}},
			PeriodSeconds: 1, TimeoutSeconds: 2, FailureThreshold: 3,
		}
	}
	return d
}

// fault posts to a fault endpoint (like /fault/unhealthy) of the worker of
// pod.
func fault(t *testing.T, pod, path string) {
	t.Helper()
	p := getPod(t, pod)
	if p == nil || p.Status.PodIP == "" {
		t.Fatalf("pod %s has no IP to send %s to", pod, path)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Post(fmt.Sprintf("http://%s:%d%s", p.Status.PodIP, faultPort, path), "text/plain", nil)
	if err != nil {
		if path == "/fault/crash" { // the process may be gone before it answers
			return
		}
		t.Fatalf("POST %s to pod %s: %v", path, pod, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s to pod %s: %s", path, pod, resp.Status)
	}
}

// getPod returns pod, or nil once it is gone.
func getPod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p, err := cluster.kube.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// containerStatus is the status of the container named name of p, regular
// or init.
func containerStatus(p *corev1.Pod, name string) corev1.ContainerStatus {
	for _, s := range slices.Concat(p.Status.ContainerStatuses, p.Status.InitContainerStatuses) {
		if s.Name == name {
			return s
		}
	}
	return corev1.ContainerStatus{}
}

// waitGone waits up to timeout for pod to be deleted and returns how long
// it took from since; it fails the test if the pod outlives timeout.
func waitGone(t *testing.T, pod string, since time.Time, timeout time.Duration) time.Duration {
	t.Helper()
	for getPod(t, pod) != nil {
		if time.Since(since) > timeout {
			t.Fatalf("pod %s still there %s after its deletion", pod, time.Since(since).Round(time.Millisecond))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(since)
}

// events are the Events of one pod: each Event's name and count, so that
// a later look tells the new ones (an Event repeated is counted, not
// written again).
type events map[string]int32

func podEvents(t *testing.T, pod string) ([]corev1.Event, events) {
	t.Helper()
	list, err := cluster.kube.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		t.Fatal(err)
	}
	seen := events{}
	for _, e := range list.Items {
		seen[e.Name] = e.Count
	}
	return list.Items, seen
}

// waitNewEvents waits up to timeout for Events of pod with each of the
// reasons that are new since before, and returns the new Events, oldest
// first. It fails the test, naming the new Events, if one is missing.
func waitNewEvents(t *testing.T, pod string, before events, timeout time.Duration, reasons ...string) []corev1.Event {
	t.Helper()
	var fresh []corev1.Event
	for deadline := time.Now().Add(timeout); ; time.Sleep(250 * time.Millisecond) {
		all, _ := podEvents(t, pod)
		fresh = fresh[:0]
		have := map[string]bool{}
		for _, e := range all {
			if n, ok := before[e.Name]; !ok || e.Count > n {
				fresh = append(fresh, e)
				have[e.Reason] = true
			}
		}
		missing := slices.DeleteFunc(slices.Clone(reasons), func(r string) bool { return have[r] })
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("pod %s: no new Event %v within %s; new Events:\n%s", pod, missing, timeout, describeEvents(fresh))
			break
		}
	}
	slices.SortFunc(fresh, func(a, b corev1.Event) int { return a.LastTimestamp.Compare(b.LastTimestamp.Time) })
	return fresh
}

func describeEvents(es []corev1.Event) string {
	var b strings.Builder
	for _, e := range es {
		fmt.Fprintf(&b, "  %s %s (x%d): %s\n", e.LastTimestamp.Format("15:04:05"), e.Reason, e.Count, e.Message)
	}
	return b.String()
}

// load enqueues messages named prefix-N at rate a second until stopped; work
// gives message N's work in milliseconds.
type load struct {
	stop     context.CancelFunc
	wg       sync.WaitGroup
	enqueued atomic.Int64
}

func startLoad(t *testing.T, prefix string, rate int, work func(i int) int) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{stop: cancel}
	t.Cleanup(l.end)
	l.wg.Go(func() {
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			msgs := []queue.Message{{DedupKey: fmt.Sprintf("%s-%d", prefix, i), Amount: int64(i%7 + 1), WorkMillis: work(i)}}
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

// end stops the load and waits for its last enqueue.
func (l *load) end() {
	l.stop()
	l.wg.Wait()
}

// shortWork is work that drains within a second or two: 100 to 600 ms,
// one message in 20 takes 2 s.
func shortWork(i int) int {
	if i%20 == 10 {
		return 2000
	}
	return 100 + (i*37)%500
}

// waitHeld waits up to timeout for the recorder to see the Lease held by a
// pod that is not gone, and returns its holder identity, or "".
func waitHeld(rec *recorder, timeout time.Duration) string {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if h := rec.holderAt(time.Now()); h != "" {
			rec.mu.Lock()
			p := rec.pods[podOf(h)]
			live := p != nil && p.gone.IsZero()
			rec.mu.Unlock()
			if live {
				return h
			}
		}
	}
	return ""
}

// waitLeaderRun waits up to timeout for a run of lease's leader job after
// since, and returns the worker that ran it, or "".
func waitLeaderRun(t *testing.T, lease string, since time.Time, timeout time.Duration) string {
	t.Helper()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		var holder string
		err := cluster.pool.QueryRow(context.Background(), `SELECT coalesce(max(holder), '') FROM handoff_leader_runs WHERE lease = $1 AND ran_at > $2`, lease, since).Scan(&holder)
		if err != nil {
			t.Fatal(err)
		}
		if holder != "" {
			return holder
		}
	}
	return ""
}

// leaderChange is one change of holder in the pods' own record of their
// leader runs (handoff_leader_runs), in time order.
type leaderChange struct {
	holder, prev     string // the new holder; the one before ("" for the first)
	token, prevToken int64  // its first run's fencing token; the last run's before (-1 for the first)
	back             bool   // holder had led before prev: it went back to an earlier holder
}

// leaderChanges reads lease's leader runs since since (the zero time for
// all), in time order, and returns one leaderChange per change of holder.
func leaderChanges(t *testing.T, lease string, since time.Time) []leaderChange {
	t.Helper()
	rows, err := cluster.pool.Query(context.Background(), `SELECT holder, token FROM handoff_leader_runs WHERE lease = $1 AND ran_at >= $2 ORDER BY ran_at, id`, lease, since)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var changes []leaderChange
	seen := map[string]bool{}
	var last int64 = -1
	for rows.Next() {
		var holder string
		var token int64
		if err := rows.Scan(&holder, &token); err != nil {
			t.Fatal(err)
		}
		if n := len(changes); n == 0 || changes[n-1].holder != holder {
			c := leaderChange{holder: holder, token: token, prevToken: last, back: seen[holder]}
			if n > 0 {
				c.prev = changes[n-1].holder
			}
			changes = append(changes, c)
			seen[holder] = true
		}
		last = token
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return changes
}

// leaderRuns returns the holders of lease's leader runs in time order, one
// entry per change of holder, and fails the test where a new holder's
// fencing token is not above its predecessor's: then two pods acted as
// leader in the same term.
func leaderRuns(t *testing.T, lease string) []string {
	t.Helper()
	var holders []string
	for _, c := range leaderChanges(t, lease, time.Time{}) {
		if c.token <= c.prevToken {
			t.Errorf("leader %s ran with fencing token %d, not above its predecessor's %d", c.holder, c.token, c.prevToken)
		}
		holders = append(holders, c.holder)
	}
	return holders
}

// deletePod deletes pod name, with grace as its grace period if not nil.
func deletePod(name string, grace *int64) error {
	return cluster.kube.CoreV1().Pods(namespace).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: grace})
}

// waitHolderClaims waits up to 30 s for the pod holding rec's Lease to
// hold claims of the messages of Deployment name with none of them left
// unclaimed, and returns that pod and its claims. At the deadline it logs
// what each pod of name did (its claims and returns, its containers, the
// end of its worker's log) and the Lease's holders, and fails the test.
func waitHolderClaims(t *testing.T, rec *recorder, name string) (victim string, claims int) {
	t.Helper()
	ctx := context.Background()
	var unclaimed int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		victim = podOf(rec.holderAt(time.Now()))
		err := cluster.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE claimed_by = $1), count(*) FILTER (WHERE claimed_by IS NULL)
			FROM handoff_queue WHERE dedup_key LIKE $2`, victim, name+"-%").Scan(&claims, &unclaimed)
		if err != nil {
			t.Fatal(err)
		}
		if victim != "" && claims > 0 && unclaimed == 0 {
			return victim, claims
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Logf("Lease %s-leader, each change of holder:\n%s", name, rec.changes())
	rows, err := cluster.pool.Query(ctx, `SELECT worker, outcome, count(*), min(at), max(at) FROM handoff_deliveries
		WHERE worker LIKE $1 GROUP BY 1, 2 ORDER BY 1, 2`, name+"-%")
	if err == nil {
		for rows.Next() {
			var worker, outcome string
			var n int
			var first, last time.Time
			if rows.Scan(&worker, &outcome, &n, &first, &last) == nil {
				t.Logf("deliveries: %s %s ×%d, %s to %s", worker, outcome, n, first.Format("15:04:05.000"), last.Format("15:04:05.000"))
			}
		}
		rows.Close()
	}
	pods, err := cluster.kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err == nil {
		for _, p := range pods.Items {
			var cs []string
			for _, s := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
				cs = append(cs, fmt.Sprintf("%s ready=%t restarts=%d started=%v", s.Name, s.Ready, s.RestartCount, s.State.Running != nil))
			}
			t.Logf("pod %s: phase %s, created %s; %s", p.Name, p.Status.Phase, p.CreationTimestamp.Format("15:04:05"), strings.Join(cs, "; "))
			tail := int64(400)
			logs, err := cluster.kube.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: p.Spec.Containers[0].Name, TailLines: &tail}).DoRaw(ctx)
			if err != nil {
				t.Logf("worker log of %s: %v", p.Name, err)
				continue
			}
			// The leader job logs a line a second: the rest tells more.
			var lines []string
			for line := range strings.Lines(string(logs)) {
				if !strings.Contains(line, `"msg":"leader job"`) {
					lines = append(lines, line)
				}
			}
			t.Logf("the end of the worker log of %s, but its leader job's lines:\n%s", p.Name, strings.Join(lines[max(0, len(lines)-25):], ""))
		}
	}
	t.Fatalf("the Lease holder %q has %d claims, %d messages unclaimed, 30s after the enqueue", victim, claims, unclaimed)
	return "", 0
}

// waitWorkersStarted waits up to a minute for the worker of each pod of
// Deployment name (with withFaults) to answer GET /healthz on its fault
// port, which it serves once its queue is migrated, just before its claim
// loops start: a pod is Ready once its containers run, which may be well
// before its worker claims (the worker has no readiness probe). It logs
// how long the workers took, and fails the test naming a pod whose worker
// did not answer.
func waitWorkersStarted(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	pods, err := cluster.kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 2 * time.Second}
	for _, p := range pods.Items {
		url := fmt.Sprintf("http://%s:%d/healthz", p.Status.PodIP, faultPort)
		for {
			resp, err := client.Get(url)
			last := fmt.Sprint(err)
			if err == nil {
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
				last = resp.Status
			}
			if time.Since(start) > time.Minute {
				t.Fatalf("the worker of pod %s did not answer GET %s within a minute of the pods being Ready (last: %s)", p.Name, url, last)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	t.Logf("the workers of %s answered %s after their pods were Ready", name, time.Since(start).Round(time.Millisecond))
}
