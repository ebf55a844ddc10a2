//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/types"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// successorRun is one rolling update measured for the role Lease's moves.
type successorRun struct {
	name     string
	replicas int32
	prefer   bool            // handoff.dev/prefer-successor
	moves    int             // pod-to-pod moves of the role Lease
	path     []string        // the pods that held it in turn
	gaps     []time.Duration // per move: the Lease seen free before the next holder
	hops     handoverHops    // the first move's, hop by hop
}

// TestRolloutMovesTheRoleOnce rolls out Deployments of 3 and 5 replicas
// under load, each twice in the same run: with handoff as it ships (the
// leaving holder's release names a successor, a pod that stays) and, as
// the baseline, with handoff.dev/prefer-successor "false" (every standby
// races for the released Lease, so an old pod the rollout deletes next may
// win it). With the successor it asserts that every pod the role Lease
// moved to during the rollout is one of the new revision, a pod that
// stays; for both, that the pods' own leader runs never go back to an
// earlier holder and each new holder's fencing token is greater. The
// moves per rollout and the Lease's free time per move, both ways, are
// logged and written to $HANDOFF_E2E_SUCCESSOR_FIGURES; without it (CI)
// the baseline's rollouts are not run.
func TestRolloutMovesTheRoleOnce(t *testing.T) {
	var runs []*successorRun
	// The baseline's rollouts only where the figures are asked for (make
	// successor-figures): they assert nothing a shipped setting needs, and
	// cost CI three minutes.
	figures := os.Getenv("HANDOFF_E2E_SUCCESSOR_FIGURES")
	for _, replicas := range []int32{3, 5} {
		for _, prefer := range []bool{true, false} {
			if !prefer && figures == "" {
				continue
			}
			name := fmt.Sprintf("succ%d", replicas)
			if !prefer {
				name += "-race"
			}
			t.Run(name, func(t *testing.T) {
				runs = append(runs, rollOnce(t, name, replicas, prefer))
			})
		}
	}
	var b strings.Builder
	if cpu := os.Getenv(sidecarCPUEnv); cpu != "" {
		fmt.Fprintf(&b, "every worker's sidecar with a CPU request of %s (%s)\n", cpu, sidecarCPUEnv)
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "replicas\tsuccessor named\tmoves\tLease free per move\tholders in turn")
	for _, r := range runs {
		if r == nil {
			continue
		}
		gaps := make([]string, len(r.gaps))
		for i, g := range r.gaps {
			gaps[i] = ms(g)
		}
		fmt.Fprintf(tw, "%d\t%t\t%d\t%s\t%s\n", r.replicas, r.prefer, r.moves, strings.Join(gaps, ", "), strings.Join(r.path, " → "))
	}
	_ = tw.Flush()
	for _, r := range runs {
		if r != nil && !r.hops.termination.IsZero() {
			fmt.Fprintf(&b, "\n%d replicas, successor named %t: the leaving leader's handover hop by hop\n%s", r.replicas, r.prefer, hopsTable(r.hops))
		}
	}
	p50, worst := leaseWriteFloor(t, 50)
	fmt.Fprintf(&b, "\nfloor: an empty Lease write's round trip from the test process, 50 in a row in this run: median %.1f ms, largest %.1f ms\n",
		float64(p50.Microseconds())/1000, float64(worst.Microseconds())/1000)
	t.Log("\n" + b.String())
	if figures != "" {
		if err := os.WriteFile(figures, []byte(b.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// sidecarCPUEnv names the variable that sets every rolled-out worker's
// sidecar CPU request (the annotation handoff.dev/sidecar-cpu-request, a
// quantity such as 100m; unset: the chart's 10m), to measure the hops of a
// handover when the node's CPU is contended: the kernel shares it out by
// the containers' requests.
const sidecarCPUEnv = "HANDOFF_E2E_SIDECAR_CPU_REQUEST"

// rollOnce deploys name with replicas pods, restarts it under load as
// kubectl rollout restart does, and returns the role Lease's moves.
func rollOnce(t *testing.T, name string, replicas int32, prefer bool) *successorRun {
	lease := name + "-leader"
	d := worker(name, replicas, 15, "--visibility-timeout", rolloutVisibility.String(), "--concurrency", "4")
	if !prefer {
		d = annotate(d, "handoff.dev/prefer-successor", "false")
	}
	if cpu := os.Getenv(sidecarCPUEnv); cpu != "" {
		d = annotate(d, "handoff.dev/sidecar-cpu-request", cpu)
	}
	deploy(t, d)
	rec := record(t, name, lease)
	l := startLoad(t, name, loadRate, shortWork)
	waitHolder(t, rec, lease)
	old := podNames(t, name)

	restart := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"e2e/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339Nano))
	restartAt := time.Now()
	if _, err := cluster.kube.AppsV1().Deployments(namespace).Patch(t.Context(), name, types.StrategicMergePatchType, []byte(restart), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRollout(t, name, 3*time.Minute)
	l.end()
	checkQueue(t, rolloutVisibility+30*time.Second)
	run := &successorRun{name: name, replicas: replicas, prefer: prefer}
	run.moves, run.path = rec.moves(restartAt, time.Now())
	run.gaps = rec.freeBeforeEachHolder(restartAt, time.Now())
	t.Logf("Lease %s: %d moves, held in turn by %s; free before each new holder: %v", lease, run.moves, strings.Join(run.path, " → "), run.gaps)
	rec.checkTerms(t, lease)
	if len(run.path) > 1 {
		leaving := &replacedPod{name: run.path[0]}
		rec.mu.Lock()
		if s := rec.pods[leaving.name]; s != nil {
			leaving.terminating = s.start()
		}
		for _, o := range rec.holders {
			if o.at.After(restartAt) && podOf(o.holder) == run.path[1] {
				leaving.successor = o.holder
				break
			}
		}
		rec.mu.Unlock()
		run.hops = (&rolloutRun{lease: lease, rec: rec}).hopsOf(t, leaving)
	}

	if prefer && len(run.path) > 0 {
		for _, p := range run.path[1:] {
			if slices.Contains(old, p) {
				t.Errorf("Lease %s moved to %s, a pod of the old revision that the rollout deletes; want only pods that stay (held in turn by %s)", lease, p, strings.Join(run.path, " → "))
			}
		}
	}
	for _, c := range leaderChanges(t, lease, restartAt) {
		if c.back {
			t.Errorf("leader runs of %s went back to %s after %s: two pods acted as leader in the same period", lease, c.holder, c.prev)
		}
		if c.prevToken >= 0 && c.token <= c.prevToken {
			t.Errorf("leader %s of %s ran with fencing token %d, not above its predecessor's %d", c.holder, lease, c.token, c.prevToken)
		}
	}
	return run
}

// waitHolder waits up to 30 s for a pod to hold the Lease.
func waitHolder(t *testing.T, rec *recorder, lease string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); rec.holderAt(time.Now()) == ""; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no pod holds Lease %s 30 s after the deploy", lease)
		}
	}
}
