package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/internal/cli/clitest"
	"github.com/handoff-dev/handoff/internal/cli/command"
	"github.com/handoff-dev/handoff/internal/cli/status"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/protocol"
	coord "github.com/handoff-dev/handoff/sidecar"
)

// statusFixture is a namespace on the real apiserver with a workload's
// injected pods, its Leases and its pods' Events, as a rollout leaves them.
type statusFixture struct {
	env  *kubetest.Env
	ns   string
	pods map[string]*corev1.Pod
}

// injectedPod creates an injected pod whose sidecar competes for the
// role Lease orders-leader, the Leases orders-audit and orders-report, and
// the shards orders-{0..3}, as injection
// writes its environment; deleting marks it deleted (a finalizer keeps
// it).
func (f *statusFixture) injectedPod(t *testing.T, name string, ready, deleting bool) {
	t.Helper()
	ctx := context.Background()
	env := []corev1.EnvVar{{Name: "HANDOFF_LEASES", Value: "orders-leader,orders-audit,orders-report"}, {Name: "HANDOFF_ROLE_LEASES", Value: "orders-leader"}, {Name: "HANDOFF_SHARDS", Value: "orders-{0..3}"}, {Name: "HANDOFF_SHARD_PEERS", Value: "app=orders"}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{inject.LabelInjected: "true", "app": "orders"},
			Annotations: map[string]string{inject.AnnotationVersion: "v0.2.0"}, Finalizers: []string{"handoff.dev/test"}},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: inject.SidecarName, Image: "handoff-sidecar", Env: env, RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}},
			Containers:     []corev1.Container{{Name: "worker", Image: "worker"}},
		},
	}
	p, err := f.env.Client.CoreV1().Pods(f.ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = f.env.Client.CoreV1().Pods(f.ns).Patch(context.Background(), name, "application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})
	p.Status.Phase = corev1.PodRunning
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
	if p, err = f.env.Client.CoreV1().Pods(f.ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if deleting {
		if err := f.env.Client.CoreV1().Pods(f.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.pods[name] = p
}

// phase writes phase on pod name's status as its sidecar does (the
// condition protocol.PodConditionCoordinating).
func (f *statusFixture) phase(t *testing.T, name string, phase protocol.Phase) {
	t.Helper()
	status := map[bool]string{true: "True", false: "False"}[phase == protocol.PhaseRunning]
	patch := `{"status":{"conditions":[{"type":"` + protocol.PodConditionCoordinating + `","status":"` + status + `","reason":"` + string(phase) + `","message":"test"}]}}`
	if _, err := f.env.Client.CoreV1().Pods(f.ns).Patch(context.Background(), name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
}

// lease writes Lease name held by pod holder ("" for a released one, or
// an identity of no pod), renewed ago before now.
func (f *statusFixture) lease(t *testing.T, name, holder string, ago time.Duration, transitions int32) {
	t.Helper()
	identity := holder
	if p := f.pods[holder]; p != nil {
		identity = p.Name + "_" + string(p.UID)
	}
	spec := coordinationv1.LeaseSpec{HolderIdentity: ptr.To(identity), LeaseDurationSeconds: ptr.To[int32](15),
		RenewTime: &metav1.MicroTime{Time: time.Now().Add(-ago)}, LeaseTransitions: ptr.To(transitions)}
	ctx := context.Background()
	l, err := f.env.Client.CoordinationV1().Leases(f.ns).Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		l.Spec = spec
		_, err = f.env.Client.CoordinationV1().Leases(f.ns).Update(ctx, l, metav1.UpdateOptions{})
	} else {
		_, err = f.env.Client.CoordinationV1().Leases(f.ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// event writes an Event about pod as the sidecar's recorder does, at.
func (f *statusFixture) event(t *testing.T, pod, reason, message string, at time.Time) {
	t.Helper()
	p := f.pods[pod]
	_, err := f.env.Client.CoreV1().Events(f.ns).Create(context.Background(), &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: pod + "."},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: f.ns, Name: pod, UID: p.UID, APIVersion: "v1"},
		Reason:         reason, Message: message, Type: corev1.EventTypeNormal, Count: 1,
		FirstTimestamp: metav1.Time{Time: at}, LastTimestamp: metav1.Time{Time: at},
		Source: corev1.EventSource{Component: "handoff"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func runStatus(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	if err := command.Execute(context.Background(), status.Command, args, nil, &out, &out); err != nil {
		t.Fatalf("handoff status %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

func decodeStatus(t *testing.T, line string) status.Report {
	t.Helper()
	var r status.Report
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("handoff status -o json: %v\n%s", err, line)
	}
	return r
}

// On the real apiserver, a workload mid-rollout: handoff status names each
// Lease's holder pod, state, term left and fencing token; the shards each
// pod holds against the fair share, and those none holds; each pod's
// phase (ShuttingDown while a deleted pod still holds a Lease or drains,
// Done after) and last handover from its Events, with its outcome; a
// handover before a Rearmed is not the last.
func TestStatusCommandShowsLeasesShardsAndHandovers(t *testing.T) {
	env := kubetest.Get(t)
	f := &statusFixture{env: env, ns: env.Namespace(t), pods: map[string]*corev1.Pod{}}
	f.injectedPod(t, "orders-a", true, false)
	f.injectedPod(t, "orders-b", true, false)
	f.injectedPod(t, "orders-old", false, true)      // deleted, draining: holds orders-2
	f.injectedPod(t, "orders-done", false, true)     // deleted, released everything
	f.injectedPod(t, "orders-draining", false, true) // deleted, holds nothing, drains
	f.injectedPod(t, "orders-rearming", true, false) // its worker restarted: its sidecar says Rearming
	// The phases the sidecars wrote: taken as they are, but Running on a
	// pod being deleted (its sequence not written yet), which is inferred.
	f.phase(t, "orders-rearming", protocol.PhaseRearming)
	f.phase(t, "orders-done", protocol.PhaseDone)
	f.phase(t, "orders-old", protocol.PhaseRunning)
	clitest.CreatePod(t, env, f.ns, "not-injected", "w", map[string]string{"app": "orders"}, nil, "")

	f.lease(t, "orders-leader", "orders-a", time.Second, 4)
	f.lease(t, "orders-0", "orders-a", 0, 1)
	f.lease(t, "orders-1", "orders-b", 0, 2)
	f.lease(t, "orders-2", "orders-old", 0, 3)
	f.lease(t, "orders-3", "orders-gone_1234", time.Hour, 5) // its holder stopped renewing an hour ago
	f.lease(t, "orders-audit", "", 0, 6)                     // released; orders-report never created
	now := time.Now().Truncate(time.Second)
	f.event(t, "orders-done", coord.ReasonDrainStarted, "Stopped claiming with 2 in flight (0 unstarted, handed back by the app at once); drain until ..., fallback return", now.Add(-3*time.Second))
	f.event(t, "orders-done", coord.ReasonDrained, "Drained in 41ms", now.Add(-2*time.Second))
	f.event(t, "orders-done", coord.ReasonLeaseReleased, "Lease orders-leader (role) released at ..., 12ms after the shutdown started", now.Add(-2*time.Second))
	f.event(t, "orders-draining", coord.ReasonDrainStarted, "Stopped claiming with 4 in flight", now.Add(-2*time.Second))
	// Its role Lease released during the drain: the drain goes on.
	f.event(t, "orders-draining", coord.ReasonLeaseReleased, "Lease orders-leader (role) released at ..., 9ms after the shutdown started", now.Add(-2*time.Second))
	f.event(t, "orders-old", coord.ReasonDrainStarted, "Stopped claiming with 1 in flight", now.Add(-time.Second))
	f.event(t, "orders-b", coord.ReasonDrainStarted, "Stopped claiming with 3 in flight", now.Add(-time.Minute))
	f.event(t, "orders-b", coord.ReasonDeadlineExceeded, "Drain deadline exceeded with 3 claims in flight; fallback abandon: left to the visibility timeout", now.Add(-50*time.Second))
	f.event(t, "orders-b", coord.ReasonRearmed, "Worker restarted: rejoined the elections for [orders-leader]", now.Add(-40*time.Second))
	f.event(t, "orders-a", coord.ReasonDrainStarted, "Stopped claiming with 1 in flight", now.Add(-30*time.Second))
	f.event(t, "orders-a", coord.ReasonDeadlineExceeded, "Drain deadline exceeded with 1 claims in flight; fallback abandon: left to the visibility timeout", now.Add(-29*time.Second))

	// orders-a's sidecar keeps its pod-deletion-cost (setting deletion-cost).
	if _, err := env.Client.CoreV1().Pods(f.ns).Patch(context.Background(), "orders-a", types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"controller.kubernetes.io/pod-deletion-cost":"10100"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	r := decodeStatus(t, runStatus(t, "--kubeconfig", env.Kubeconfig, "-n", f.ns, "-l", "app=orders", "-o", "json"))
	for _, p := range r.Pods {
		switch {
		case p.Name == "orders-a" && (p.DeletionCost == nil || *p.DeletionCost != 10100):
			t.Errorf("pod orders-a: deletionCost %v, want 10100 from its annotation", p.DeletionCost)
		case p.Name != "orders-a" && p.DeletionCost != nil:
			t.Errorf("pod %s: deletionCost %d, want none (no annotation)", p.Name, *p.DeletionCost)
		}
	}
	if wide := runStatus(t, "--kubeconfig", env.Kubeconfig, "-n", f.ns, "-l", "app=orders", "-o", "wide"); !strings.Contains(wide, "DELETION COST") ||
		!regexp.MustCompile(`(?m)^orders-a\s.*\s10100$`).MatchString(wide) {
		t.Errorf("-o wide does not show orders-a's deletion cost 10100 in a DELETION COST column:\n%s", wide)
	}
	if r.Namespace != f.ns || r.Selector != "handoff.dev/injected=true,app=orders" {
		t.Errorf("namespace %q, selector %q", r.Namespace, r.Selector)
	}
	type lease struct {
		name, kind, state, holder string
		token                     int64
	}
	var leases []lease
	for _, l := range r.Leases {
		leases = append(leases, lease{l.Name, string(l.Kind), l.State, l.HolderPod, l.FencingToken})
		if l.State == "Held" && (l.TermLeftSeconds <= 10 || l.TermLeftSeconds > 15) {
			t.Errorf("Lease %s: term left %vs, want renewTime + 15s - now (up to 15s; the test renewed it at most a second ago)", l.Name, l.TermLeftSeconds)
		}
		if l.State != "Held" && l.TermLeftSeconds != 0 {
			t.Errorf("Lease %s (%s): term left %v, want 0", l.Name, l.State, l.TermLeftSeconds)
		}
	}
	wantLeases := []lease{
		{"orders-0", "partition", "Held", "orders-a", 1},
		{"orders-1", "partition", "Held", "orders-b", 2},
		{"orders-2", "partition", "Held", "orders-old", 3},
		{"orders-3", "partition", "Expired", "", 5},
		{"orders-audit", "partition", "Free", "", 6},
		{"orders-leader", "role", "Held", "orders-a", 4},
		{"orders-report", "partition", "Missing", "", 0},
	}
	if !reflect.DeepEqual(leases, wantLeases) {
		t.Errorf("leases:\n%+v\nwant\n%+v", leases, wantLeases)
	}
	wantShards := []status.ShardSetView{{Shards: "orders-{0..3}", Leases: []string{"orders-0", "orders-1", "orders-2", "orders-3"},
		Peers: 3, FairShare: 2, Owners: []status.ShardOwner{{Pod: "orders-a", Shards: []string{"orders-0"}}, {Pod: "orders-b", Shards: []string{"orders-1"}}, {Pod: "orders-old", Shards: []string{"orders-2"}}},
		Unowned: []string{"orders-3"}}}
	if !reflect.DeepEqual(r.ShardSets, wantShards) {
		t.Errorf("shard sets:\n%+v\nwant\n%+v", r.ShardSets, wantShards)
	}
	type pod struct {
		name, phase, from string
		ready             bool
		leases            string
		outcome           string
		steps             int
	}
	var pods []pod
	for _, p := range r.Pods {
		v := pod{p.Name, p.Phase, p.PhaseFrom, p.Ready, strings.Join(p.Leases, ","), "", 0}
		if h := p.LastHandover; h != nil {
			v.outcome, v.steps = h.Outcome, len(h.Steps)
		}
		if p.Version != "v0.2.0" {
			t.Errorf("pod %s: version %q, want its handoff.dev/version", p.Name, p.Version)
		}
		if (p.DeletionTimestamp != nil) != (p.Phase == "ShuttingDown" || p.Phase == "Done") {
			t.Errorf("pod %s: deletionTimestamp %v with phase %s", p.Name, p.DeletionTimestamp, p.Phase)
		}
		pods = append(pods, v)
	}
	wantPods := []pod{
		{"orders-a", "Running", "inferred", true, "orders-0,orders-leader", "Abandoned", 2},
		{"orders-b", "Running", "inferred", true, "orders-1", "", 0},
		{"orders-done", "Done", "sidecar", false, "", "Drained", 3},
		{"orders-draining", "ShuttingDown", "inferred", false, "", "InProgress", 2},
		{"orders-old", "ShuttingDown", "inferred", false, "orders-2", "InProgress", 1},
		{"orders-rearming", "Rearming", "sidecar", true, "", "", 0},
	}
	if !reflect.DeepEqual(pods, wantPods) {
		t.Errorf("pods:\n%+v\nwant\n%+v", pods, wantPods)
	}

	// The text view: a line per Lease, the shard set, a line per pod, and
	// the steps of the drain under way.
	text := runStatus(t, "--kubeconfig", env.Kubeconfig, "-n", f.ns, "-l", "app=orders")
	for _, want := range []string{
		"orders-leader  role       Held     orders-a",
		"orders-3       partition  Expired  (not an injected pod)",
		"Shards orders-{0..3}: 4 shards, 3 peers up, fair share 2",
		"(held by none)  orders-3",
		"orders-old       v0.2.0   ShuttingDown  false  orders-2",
		"orders-old, last handover (InProgress):",
		"DrainStarted           Stopped claiming with 1 in flight",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("handoff status: no %q in\n%s", want, text)
		}
	}
	if strings.Contains(text, "not-injected") {
		t.Errorf("handoff status shows a pod that is not injected:\n%s", text)
	}
}

// handoff status --watch prints a view at start and again when a Lease
// moves: the test reads the new holder from the JSON lines.
func TestStatusWatchShowsTheLeaseMove(t *testing.T) {
	env := kubetest.Get(t)
	f := &statusFixture{env: env, ns: env.Namespace(t), pods: map[string]*corev1.Pod{}}
	f.injectedPod(t, "orders-a", true, false)
	f.injectedPod(t, "orders-b", true, false)
	f.lease(t, "orders-leader", "orders-a", 0, 1)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	args := []string{"--kubeconfig", env.Kubeconfig, "-n", f.ns, "--watch", "-o", "json"}
	done := make(chan error, 1)
	go func() { done <- command.Execute(ctx, status.Command, args, nil, pw, pw); _ = pw.Close() }()

	lines := bufio.NewScanner(pr)
	lines.Buffer(nil, 1<<20)
	holder := func() string {
		if !lines.Scan() {
			t.Fatalf("handoff status --watch ended: %v", lines.Err())
		}
		for _, l := range decodeStatus(t, lines.Text()).Leases {
			if l.Name == "orders-leader" {
				return l.HolderPod
			}
		}
		return ""
	}
	if h := holder(); h != "orders-a" {
		t.Fatalf("first view: orders-leader held by %q, want orders-a", h)
	}
	f.lease(t, "orders-leader", "", 0, 1) // released
	f.lease(t, "orders-leader", "orders-b", 0, 2)
	for h := holder(); h != "orders-b"; h = holder() {
		// A view between the two writes shows it free; the next shows it moved.
		if h != "" && h != "orders-a" {
			t.Fatalf("orders-leader held by %q, want it to move from orders-a to orders-b", h)
		}
	}
	cancel()
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if err := <-done; err != nil {
		t.Errorf("handoff status --watch ended with %v, want nil once interrupted", err)
	}
}
