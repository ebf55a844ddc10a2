//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	riverqueue "github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/config"
	"github.com/handoff-dev/handoff/inject"
)

// applyArgs is examples/riverworker's job (ApplyArgs, in a main package):
// work for Millis, then write Key to riverworker_applied, fenced.
type applyArgs struct {
	Key    string `json:"key"`
	Millis int    `json:"millis"`
}

func (applyArgs) Kind() string { return "apply" }

// riverWorker is examples/riverworker's Deployment, run as serviceAccount
// and labelled for the webhook to inject handoff (no Lease: its jobs are
// its only claims).
func riverWorker(name string, replicas int32, grace int64, args ...string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name, inject.LabelInject: "true"}},
				Spec: corev1.PodSpec{
					ServiceAccountName:            serviceAccount,
					TerminationGracePeriodSeconds: ptr.To(grace),
					Containers: []corev1.Container{{
						Name: "worker", Image: images.riverworker, ImagePullPolicy: images.pullPolicy,
						Args: append([]string{"--database-url", cluster.podDBURL}, args...),
					}},
				},
			},
		},
	}
}

// TestRiverWorkerHandover deletes one of two River workers while it runs
// jobs longer than its drain window: the jobs it still runs at its drain
// deadline are handed back and started by the other worker at once (not
// after River's rescuer, an hour by default), every job is applied exactly
// once (the effect fenced by worker/river's Fence), and the pod is gone
// within its grace period.
func TestRiverWorkerHandover(t *testing.T) {
	ctx := context.Background()
	const (
		name  = "river"
		grace = 10 // s; the drain deadline is 2 s (deadline-margin) before the deletion's
		long  = 15 * time.Second
		short = 300
	)
	deploy(t, riverWorker(name, 2, grace, "--concurrency", "10"))

	client, err := riverqueue.NewClient[pgx.Tx](riverpgxv5.New(cluster.pool), &riverqueue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	insert := func(args []applyArgs) {
		t.Helper()
		params := make([]riverqueue.InsertManyParams, len(args))
		for i, a := range args {
			params[i] = riverqueue.InsertManyParams{Args: a}
		}
		// The workers migrate River's tables at start: retried until they
		// exist.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			_, err := client.InsertMany(ctx, params)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("insert %d jobs: %v", len(params), err)
			}
		}
	}
	// 6 jobs that outlive the drain window, then wait until both workers
	// together run all of them.
	var longJobs []applyArgs
	for i := range 6 {
		longJobs = append(longJobs, applyArgs{Key: fmt.Sprintf("%s-long-%d", name, i), Millis: int(long.Milliseconds())})
	}
	insert(longJobs)
	runningOn := map[string][]int64{} // pod: its long jobs running
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("long jobs running after 30s: %v, want all 6", runningOn)
		}
		rows, _ := cluster.pool.Query(ctx, `SELECT id, attempted_by[array_length(attempted_by, 1)] FROM river_job
			WHERE state = 'running' AND args->>'key' LIKE $1`, name+"-long-%")
		var n int
		runningOn = map[string][]int64{}
		var id int64
		var pod string
		_, err := pgx.ForEachRow(rows, []any{&id, &pod}, func() error {
			runningOn[pod] = append(runningOn[pod], id)
			n++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if n == len(longJobs) {
			break
		}
	}
	var victim string
	for pod, ids := range runningOn {
		if len(ids) > len(runningOn[victim]) {
			victim = pod
		}
	}
	handedBack := runningOn[victim]
	t.Logf("long jobs running: %v; deleting %s", runningOn, victim)

	// The short ones, worked by both until the delete, then by the other.
	var shortJobs []applyArgs
	for i := range short {
		shortJobs = append(shortJobs, applyArgs{Key: fmt.Sprintf("%s-short-%d", name, i), Millis: 20 + i%10*20})
	}
	insert(shortJobs)

	deleted := time.Now()
	if err := cluster.kube.CoreV1().Pods(namespace).Delete(ctx, victim, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := cluster.kube.CoreV1().Pods(namespace).Get(ctx, victim, metav1.GetOptions{})
	if err != nil || pod.DeletionTimestamp == nil {
		t.Fatalf("pod %s just deleted: %v, deletionTimestamp %v", victim, err, pod.GetDeletionTimestamp())
	}
	// The sidecar's drain deadline, where its fallback hands back: the
	// deletion's (as stored, in whole seconds, which the sidecar reads too)
	// minus deadline-margin and handback-reserve (their defaults).
	drainDeadline := pod.DeletionTimestamp.Add(-defaultDuration(t, "deadline-margin") - defaultDuration(t, "handback-reserve"))
	for {
		if _, err := cluster.kube.CoreV1().Pods(namespace).Get(ctx, victim, metav1.GetOptions{}); err != nil {
			break
		}
		if time.Since(deleted) > (grace+10)*time.Second {
			t.Fatalf("pod %s still there %s after a delete with a %ds grace period", victim, time.Since(deleted), grace)
		}
		time.Sleep(100 * time.Millisecond)
	}
	gone := time.Since(deleted)
	t.Logf("%s with %d long jobs gone %s after the delete (grace period %ds)", victim, len(handedBack), gone.Round(time.Millisecond), grace)
	if gone > (grace+2)*time.Second {
		t.Errorf("pod took %s to go, more than its %ds grace period (and 2s for the kubelet's bookkeeping)", gone, grace)
	}

	// The hand back was the sidecar's fallback at the deadline (not only the
	// worker's own stop on SIGTERM, which also makes its jobs available).
	events, err := cluster.kube.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + victim})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, e := range events.Items {
		seen = append(seen, e.Reason+": "+e.Message)
	}
	if m := returnedCount.FindStringSubmatch(strings.Join(seen, "\n")); m == nil {
		t.Errorf("no count of returned claims among the pod's Events:\n%s", strings.Join(seen, "\n"))
	} else if n, _ := strconv.Atoi(m[1]); n != len(handedBack) {
		t.Errorf("the Event says %d claims returned; the pod ran %d long jobs", n, len(handedBack))
	}

	// Every job completed, each applied exactly once.
	total := len(longJobs) + short
	for deadline := time.Now().Add(long + 60*time.Second); ; time.Sleep(250 * time.Millisecond) {
		var done int
		if err := cluster.pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE state = 'completed' AND args->>'key' LIKE $1`, name+"-%").Scan(&done); err != nil {
			t.Fatal(err)
		}
		if done == total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d jobs completed %s after the delete", done, total, time.Since(deleted).Round(time.Second))
		}
	}
	var keys, applied, twice int
	err = cluster.pool.QueryRow(ctx, `SELECT count(DISTINCT key), count(*), count(*) - count(DISTINCT key) FROM riverworker_applied WHERE key LIKE $1`, name+"-%").Scan(&keys, &applied, &twice)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d jobs, %d keys applied, %d applications", total, keys, applied)
	if keys != total || twice != 0 {
		t.Errorf("%d of %d keys applied, %d applied twice; want each once", keys, total, twice)
	}

	// The long jobs the victim ran at its deadline: run again by the other
	// worker, started (attempted_at) within seconds of the deadline and of
	// their hand back (scheduled_at), applied by it.
	var afterDeadline, afterHandBack []time.Duration
	for _, id := range handedBack {
		var attemptedAt, scheduledAt time.Time
		var attemptedBy []string
		var by string
		err := cluster.pool.QueryRow(ctx, `SELECT j.attempted_at, j.scheduled_at, j.attempted_by, a.worker
			FROM river_job j JOIN riverworker_applied a ON a.job_id = j.id WHERE j.id = $1`, id).Scan(&attemptedAt, &scheduledAt, &attemptedBy, &by)
		if err != nil {
			t.Fatalf("job %d: %v", id, err)
		}
		if by == victim || !slices.Contains(attemptedBy, victim) {
			t.Errorf("job %d: applied by %s, attempted by %v; want applied by the other worker after %s", id, by, attemptedBy, victim)
		}
		if d := scheduledAt.Sub(drainDeadline); d < -time.Second || d > 2*time.Second || attemptedAt.Before(scheduledAt) {
			t.Errorf("job %d: handed back %s after %s's drain deadline, started again %s after; want the hand back at the deadline, then the start",
				id, d, victim, attemptedAt.Sub(drainDeadline))
		}
		afterDeadline = append(afterDeadline, attemptedAt.Sub(drainDeadline))
		afterHandBack = append(afterHandBack, attemptedAt.Sub(scheduledAt))
	}
	sort.Slice(afterDeadline, func(i, j int) bool { return afterDeadline[i] < afterDeadline[j] })
	sort.Slice(afterHandBack, func(i, j int) bool { return afterHandBack[i] < afterHandBack[j] })
	t.Logf("the %d jobs %s ran at its drain deadline started again by the other worker %v after the deadline (%v after their hand back)",
		len(handedBack), victim, afterDeadline, afterHandBack)
	// A few seconds: River's rescuer would take an hour (RescueStuckJobsAfter's
	// default), its fetch poll 1 s.
	if last := afterDeadline[len(afterDeadline)-1]; last > 3*time.Second {
		t.Errorf("a handed-back job started again %s after %s's drain deadline, want within 3s", last, victim)
	}
}

// defaultDuration is the default of the handoff setting name (a duration).
func defaultDuration(t *testing.T, name string) time.Duration {
	t.Helper()
	st, ok := config.Lookup(name)
	if !ok {
		t.Fatalf("no handoff setting %s", name)
	}
	d, err := time.ParseDuration(st.Default)
	if err != nil {
		t.Fatalf("setting %s's default %q: %v", name, st.Default, err)
	}
	return d
}
