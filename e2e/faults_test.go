//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
)

// The mid-drain faults' workload: work that drains within the drain window
// (grace period less deadline-margin and handback-reserve, 16 s) and whose
// claims are hidden for longer than it lasts, so a claim comes back only
// when its worker is gone.
//
// The fault workers claim one message at a time (--batch 1): a batch of 4
// messages of 12 s each, worked in turn, would hold its last ones
// unstarted past the 20 s visibility timeout, to be redelivered meanwhile,
// and the queue would empty later than checkQueue's bound allows. (A
// batch held unstarted past its visibility timeout is open: see
// docs/reliability.md.)
const (
	faultGrace      = 20 // seconds
	faultWork       = 12 * time.Second
	faultVisibility = 20 * time.Second
)

// drainUnderWay is a pod of a 2-replica Deployment deleted while it holds
// the Lease and claims: its drain has started (a new DrainStarted Event).
type drainUnderWay struct {
	name, lease, victim string
	rec                 *recorder
	claims              int
	deletedAt           time.Time
	seen                events // the victim's Events before its deletion
}

// startDrain deploys d (2 replicas of name, its worker withFaults, whose
// /healthz tells that it has started), gives the workers 8 messages of
// faultWork once both have started, deletes the Lease holder once it holds
// claims, and returns when its sidecar has started to drain.
func startDrain(t *testing.T, d *appsv1.Deployment) *drainUnderWay {
	t.Helper()
	ctx := context.Background()
	name := d.Name
	deploy(t, d)
	u := &drainUnderWay{name: name, lease: name + "-leader", rec: record(t, name, name+"-leader")}
	waitWorkersStarted(t, name)
	var msgs []queue.Message
	for i := range 8 {
		msgs = append(msgs, queue.Message{DedupKey: fmt.Sprintf("%s-%d", name, i), Amount: int64(i + 1), WorkMillis: int(faultWork.Milliseconds())})
	}
	if err := queue.Enqueue(ctx, cluster.pool, msgs); err != nil {
		t.Fatal(err)
	}
	u.victim, u.claims = waitHolderClaims(t, u.rec, name)
	_, u.seen = podEvents(t, u.victim)
	u.deletedAt = time.Now()
	if err := deletePod(u.victim, nil); err != nil {
		t.Fatal(err)
	}
	waitNewEvents(t, u.victim, u.seen, 10*time.Second, "DrainStarted")
	t.Logf("Lease holder %s with %d claims deleted; its drain started %s later", u.victim, u.claims, time.Since(u.deletedAt).Round(time.Millisecond))
	return u
}

// goneInGrace waits for the victim to go and fails the test if it took
// longer than its grace period (and 2 s for the kubelet's bookkeeping).
func (u *drainUnderWay) goneInGrace(t *testing.T) {
	t.Helper()
	gone := waitGone(t, u.victim, u.deletedAt, (faultGrace+15)*time.Second)
	t.Logf("pod %s gone %s after its deletion (grace period %ds)", u.victim, gone.Round(time.Millisecond), faultGrace)
	if gone > (faultGrace+2)*time.Second {
		t.Errorf("pod %s took %s to go, more than its %ds grace period (and 2s)", u.victim, gone, faultGrace)
	}
}

// nodeOnly skips tests that reach into the node's containerd, which only
// our own cluster has on this machine.
func nodeOnly(t *testing.T) {
	t.Helper()
	if cluster.ctr == nil {
		t.Skip("needs the node's containerd on this machine (the cluster e2e/cluster boots)")
	}
}

// signalSidecar sends sig (SIGKILL, SIGTERM) to the handoff sidecar
// container of pod, through the node's containerd.
func signalSidecar(t *testing.T, pod, sig string) {
	t.Helper()
	p := getPod(t, pod)
	if p == nil {
		t.Fatalf("pod %s is gone: no sidecar to send %s", pod, sig)
	}
	id := containerStatus(p, "handoff").ContainerID
	_, id, ok := strings.Cut(id, "containerd://")
	if !ok {
		t.Fatalf("pod %s: the sidecar has no containerd container ID (%q)", pod, containerStatus(p, "handoff").ContainerID)
	}
	args := append(append([]string{}, cluster.ctr[1:]...), "tasks", "kill", "--signal", sig, id)
	if out, err := exec.Command(cluster.ctr[0], args...).CombinedOutput(); err != nil {
		t.Fatalf("ctr tasks kill --signal %s (sidecar of %s): %v: %s", sig, pod, err, out)
	}
}

// TestSidecarKilledMidDrain: the sidecar of the Lease holder is SIGKILLed
// while it drains. It cannot release the Lease, so no other pod may hold it
// before the last term it renewed is over; the claims it held come back
// (after their visibility timeout) and are applied once; the pod still goes
// within its grace period.
func TestSidecarKilledMidDrain(t *testing.T) {
	nodeOnly(t)
	d := withFaults(worker("sigkill", 2, faultGrace, "--visibility-timeout", faultVisibility.String(), "--concurrency", "4", "--batch", "1"), false)
	u := startDrain(t, d)
	signalSidecar(t, u.victim, "SIGKILL")
	t.Logf("sidecar of %s killed %s after the deletion", u.victim, time.Since(u.deletedAt).Round(time.Millisecond))
	u.goneInGrace(t)
	if h := waitHeld(u.rec, 30*time.Second); h == "" || podOf(h) == u.victim {
		t.Errorf("Lease %s held by %q 30s after its holder's sidecar was killed; want the other pod", u.lease, h)
	}
	u.rec.checkTerms(t, u.lease)
	checkQueue(t, faultVisibility+faultWork+30*time.Second)
	t.Logf("leader runs by %v", leaderRuns(t, u.lease))
}

// TestWorkerCrashMidDrain: the worker of the Lease holder crashes while its
// sidecar drains it. The sequence ends at once (the app is gone) rather than
// at the deadline, the Lease is released, the crashed worker's claims come
// back (after their visibility timeout) and are applied once, and the pod
// goes within its grace period.
func TestWorkerCrashMidDrain(t *testing.T) {
	d := withFaults(worker("crash", 2, faultGrace, "--visibility-timeout", faultVisibility.String(), "--concurrency", "4", "--batch", "1"), false)
	u := startDrain(t, d)
	fault(t, u.victim, "/fault/crash")
	crashed := time.Now()
	evs := waitNewEvents(t, u.victim, u.seen, 10*time.Second, "LeaseReleased")
	t.Logf("new Events of %s:\n%s", u.victim, describeEvents(evs))
	for _, e := range evs {
		if e.Reason == "DrainDeadlineExceeded" {
			t.Errorf("the drain of %s waited for its deadline although its worker had crashed: %s", u.victim, e.Message)
		}
	}
	if released := time.Since(crashed); released > 5*time.Second {
		t.Errorf("Lease released %s after the worker crashed; want at once (the app is gone)", released)
	}
	u.goneInGrace(t)
	if h := waitHeld(u.rec, 10*time.Second); h == "" || podOf(h) == u.victim {
		t.Errorf("Lease %s held by %q after the release; want the other pod", u.lease, h)
	}
	u.rec.checkTerms(t, u.lease)
	checkQueue(t, faultVisibility+faultWork+30*time.Second)
}

// kubectl runs the kubectl of the cluster's version (or the one on PATH
// for a given cluster) with the cluster's kubeconfig.
func kubectl(ctx context.Context, args ...string) *exec.Cmd {
	bin := "kubectl"
	if cluster.ctr != nil {
		if out, err := exec.Command("bash", "../hack/kube-assets.sh", "kubectl").Output(); err == nil {
			bin = filepath.Join(strings.TrimSpace(string(out)), "kubectl")
		}
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", cluster.kubeconfig, "--namespace", namespace}, args...)...)
	cmd.Env = os.Environ()
	return cmd
}

// TestPreStopTwice: the preStop hook delivered more than once while a
// drain is under way (the kubelet's own hook for a deletion of the Lease
// holder, whose 12 s work keeps it draining, and two more run at once with
// kubectl exec, the pod's hook command as injected): every caller gets the
// same report of one sequence, and the pod records one drain.
func TestPreStopTwice(t *testing.T) {
	ctx := context.Background()
	d := withFaults(worker("twice", 2, faultGrace, "--visibility-timeout", faultVisibility.String(), "--concurrency", "4", "--batch", "1"), false)
	u := startDrain(t, d)
	var hook []string
	if p := getPod(t, u.victim); p != nil {
		for _, c := range p.Spec.Containers {
			if c.Name == "worker" && c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Exec != nil {
				hook = c.Lifecycle.PreStop.Exec.Command
			}
		}
	}
	if len(hook) == 0 {
		t.Fatalf("pod %s: the worker has no exec preStop hook", u.victim)
	}
	outs := make([]string, 2)
	var wg sync.WaitGroup
	for i := range outs {
		wg.Go(func() {
			out, err := kubectl(ctx, append([]string{"exec", u.victim, "-c", "worker", "--"}, hook...)...).CombinedOutput()
			outs[i] = string(out)
			if err != nil {
				t.Errorf("kubectl exec %s -- %s: %v:\n%s", u.victim, strings.Join(hook, " "), err, out)
			}
		})
	}
	wg.Wait()
	t.Logf("the report both calls printed, %s after the deletion:\n%s", time.Since(u.deletedAt).Round(time.Millisecond), outs[0])
	// The sidecar's watch of its Pod started the sequence at the deletion;
	// the kubelet's hook and both calls here joined it.
	if outs[0] != outs[1] || !strings.HasPrefix(outs[0], "handoff: Drained by deletion") {
		t.Errorf("the two preStop calls printed different reports, or not one of a drain started by the deletion:\n--- first\n%s--- second\n%s", outs[0], outs[1])
	}
	u.goneInGrace(t)
	evs := waitNewEvents(t, u.victim, u.seen, 10*time.Second, "DrainStarted", "Drained", "LeaseReleased")
	drains := 0
	for _, e := range evs {
		if e.Reason == "DrainStarted" {
			drains += int(e.Count)
		}
	}
	if drains != 1 {
		t.Errorf("pod %s started %d drains; want one sequence for every trigger:\n%s", u.victim, drains, describeEvents(evs))
	}
	u.rec.checkTerms(t, u.lease)
	checkQueue(t, faultVisibility+faultWork+30*time.Second)
}

// TestSidecarSIGTERMWithoutHook: SIGTERM reaches the Lease holder's
// sidecar while the worker is alive and no preStop hook ran (the pod is not
// being deleted): that is a restart of the sidecar container alone. The
// worker is not stopped; the sidecar exits keeping the Lease (a
// SidecarRestart Event, no DrainStarted), the kubelet restarts it, and the
// new sidecar process renews the Lease under the same holder identity: no
// other pod holds it meanwhile. A later deletion still drains. No message is
// lost or applied twice.
func TestSidecarSIGTERMWithoutHook(t *testing.T) {
	nodeOnly(t)
	name := "sigterm"
	lease := name + "-leader"
	deploy(t, worker(name, 2, faultGrace, "--visibility-timeout", faultVisibility.String(), "--concurrency", "4", "--batch", "1"))
	rec := record(t, name, lease)
	l := startLoad(t, name, 5, shortWork)
	holder := waitHeld(rec, 30*time.Second)
	victim := podOf(holder)
	if victim == "" {
		t.Fatalf("no pod of %s holds its Lease", name)
	}
	restarts := containerStatus(getPod(t, victim), "handoff").RestartCount
	_, seen := podEvents(t, victim)
	signalled := time.Now()
	signalSidecar(t, victim, "SIGTERM")
	evs := waitNewEvents(t, victim, seen, 20*time.Second, "SidecarRestart")
	t.Logf("new Events of %s after SIGTERM to its sidecar:\n%s", victim, describeEvents(evs))
	for _, e := range evs {
		if e.Reason == "DrainStarted" {
			t.Errorf("SIGTERM to the sidecar of a pod that stays started a drain: %s", e.Message)
		}
	}
	var p *corev1.Pod
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		if p = getPod(t, victim); p != nil {
			if s := containerStatus(p, "handoff"); s.RestartCount > restarts && s.Ready {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the kubelet did not restart %s's sidecar, ready, within 60s", victim)
		}
	}
	if p.DeletionTimestamp != nil {
		t.Errorf("pod %s deleted after SIGTERM to its sidecar", victim)
	}
	rec.mu.Lock()
	for _, h := range rec.holders {
		if h.at.After(signalled) && h.holder != "" && h.holder != holder {
			t.Errorf("Lease %s held by %q at %s, while %s's sidecar restarted; want only %q", lease, h.holder, h.at.Format("15:04:05.000"), victim, holder)
		}
	}
	rec.mu.Unlock()
	if h := rec.holderAt(time.Now()); h != holder {
		t.Errorf("Lease %s held by %q after the sidecar restart; want %q, renewed by the new sidecar process", lease, h, holder)
	}
	rec.checkTerms(t, lease)

	// The restarted sidecar coordinates: a deletion drains.
	_, seen = podEvents(t, victim)
	if err := deletePod(victim, nil); err != nil {
		t.Fatal(err)
	}
	evs = waitNewEvents(t, victim, seen, 30*time.Second, "DrainStarted", "LeaseReleased")
	t.Logf("new Events of %s after its deletion:\n%s", victim, describeEvents(evs))
	l.end()
	checkQueue(t, faultVisibility+30*time.Second)
}

// TestStatefulSetReplacementDoesNotInheritTheLease: a StatefulSet's pod
// is replaced under the same name while the old one's term is still
// valid: its sidecar frozen (SIGSTOP, so it neither renews nor releases),
// the pod force-deleted, and the StatefulSet controller creates the new
// pod at once. The holder identity is name_UID, so the new pod must wait
// for the old term to run out: the Lease never names the new UID before
// the old holder's last renewTime plus its lease duration.
func TestStatefulSetReplacementDoesNotInheritTheLease(t *testing.T) {
	nodeOnly(t)
	ctx := context.Background()
	const name, lease = "stateful", "stateful-leader"
	d := worker(name, 1, faultGrace, "--visibility-timeout", faultVisibility.String(), "--concurrency", "4", "--batch", "1")
	ss := &appsv1.StatefulSet{
		ObjectMeta: d.ObjectMeta,
		Spec: appsv1.StatefulSetSpec{
			Replicas: d.Spec.Replicas, Selector: d.Spec.Selector, Template: d.Spec.Template, ServiceName: name,
		},
	}
	if _, err := cluster.kube.AppsV1().StatefulSets(namespace).Create(ctx, ss, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.kube.AppsV1().StatefulSets(namespace).Delete(ctx, name, metav1.DeleteOptions{})
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) && len(podNames(t, name)) > 0 {
			time.Sleep(200 * time.Millisecond)
		}
	})
	rec := record(t, name, lease)
	pod := name + "-0"
	old := waitHeld(rec, 90*time.Second)
	if podOf(old) != pod {
		t.Fatalf("Lease %s held by %q 90s after the StatefulSet was created; want %s", lease, old, pod)
	}
	l := startLoad(t, name, 5, shortWork)
	time.Sleep(3 * time.Second)
	oldUID := string(getPod(t, pod).UID)
	signalSidecar(t, pod, "SIGSTOP")
	stopped := time.Now()
	if err := deletePod(pod, ptr.To[int64](0)); err != nil {
		t.Fatal(err)
	}
	// The new pod of the same name, with a new UID, takes the Lease once
	// the old term is over.
	var now string
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		now = rec.holderAt(time.Now())
		if podOf(now) == pod && !strings.HasSuffix(now, "_"+oldUID) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Lease %s held by %q 2 minutes after %s was replaced; want the new %s", lease, now, pod, pod)
		}
	}
	t.Logf("sidecar of %s (UID %s) stopped and the pod force-deleted; %s took Lease %s %s later", pod, oldUID, now, lease, time.Since(stopped).Round(time.Millisecond))
	if now == old {
		t.Errorf("the new pod %s holds the Lease as %q, the old pod's identity", pod, now)
	}
	rec.checkTerms(t, lease)
	l.end()
	checkQueue(t, faultVisibility+30*time.Second)
}

// TestNodeDrainHandsOver: kubectl drain of the node under load, through
// the Eviction API with the chart's PodDisruptionBudget for the webhook in
// place (the drain takes only the workers: --pod-selector), and a grace
// period of 8 s, shorter than the pods' 20 s. Each evicted worker hands
// over before its deadline, which the sidecar takes from the eviction's
// deletionTimestamp (its drain until is that less deadline-margin and
// handback-reserve, 4 s), is gone within the 8 s, and once the node is
// uncordoned the new workers finish every message, once.
func TestNodeDrainHandsOver(t *testing.T) {
	ctx := context.Background()
	const name, lease = "evict", "evict-leader"
	deploy(t, worker(name, 2, faultGrace, "--visibility-timeout", faultVisibility.String(), "--concurrency", "4", "--batch", "1"))
	rec := record(t, name, lease)
	l := startLoad(t, name, 5, shortWork)
	if waitHeld(rec, 30*time.Second) == "" {
		t.Fatalf("no pod of %s holds Lease %s", name, lease)
	}
	pods := podNames(t, name)
	seen := map[string]events{}
	for _, p := range pods {
		_, seen[p] = podEvents(t, p)
	}
	node := getPod(t, pods[0]).Spec.NodeName
	t.Cleanup(func() {
		if out, err := kubectl(ctx, "uncordon", node).CombinedOutput(); err != nil {
			t.Errorf("kubectl uncordon %s: %v: %s", node, err, out)
		}
	})
	start := time.Now()
	out, err := kubectl(ctx, "drain", node, "--pod-selector", "app="+name, "--delete-emptydir-data", "--ignore-daemonsets",
		"--grace-period", "8", "--timeout", "2m").CombinedOutput()
	t.Logf("kubectl drain %s (%s):\n%s", node, time.Since(start).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("kubectl drain: %v", err)
	}
	for _, p := range pods {
		rec.mu.Lock()
		s := rec.pods[p]
		var gone time.Duration
		var deadline time.Time
		if s != nil && !s.gone.IsZero() {
			gone, deadline = s.gone.Sub(start), s.deadline
		}
		rec.mu.Unlock()
		if deadline.IsZero() {
			t.Errorf("pod %s: its eviction and deletion were not seen", p)
			continue
		}
		if gone > 10*time.Second {
			t.Errorf("pod %s gone %s after the drain began; want within its 8s grace period (and 2s)", p, gone)
		}
		evs := waitNewEvents(t, p, seen[p], 10*time.Second, "DrainStarted")
		t.Logf("pod %s evicted, gone %s after the drain began; its new Events:\n%s", p, gone.Round(time.Millisecond), describeEvents(evs))
		want := deadline.Add(-4 * time.Second)
		for _, e := range evs {
			if m := drainUntil.FindStringSubmatch(e.Message); e.Reason == "DrainStarted" && m != nil {
				if at, err := time.Parse(time.RFC3339Nano, m[1]); err != nil || !at.Equal(want) {
					t.Errorf("pod %s drains until %s; want its deletionTimestamp %s less 4s, %s", p, m[1],
						deadline.Format(time.RFC3339), want.Format(time.RFC3339Nano))
				}
			}
		}
	}
	if out, err := kubectl(ctx, "uncordon", node).CombinedOutput(); err != nil {
		t.Fatalf("kubectl uncordon %s: %v: %s", node, err, out)
	}
	waitRollout(t, name, 2*time.Minute)
	if waitHeld(rec, 30*time.Second) == "" {
		t.Errorf("no pod holds Lease %s after the node was uncordoned", lease)
	}
	rec.checkTerms(t, lease)
	l.end()
	checkQueue(t, faultVisibility+30*time.Second)
}
