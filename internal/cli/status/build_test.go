package status

import (
	"reflect"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/handoff-dev/handoff/inject"
	"github.com/handoff-dev/handoff/protocol"
	coord "github.com/handoff-dev/handoff/sidecar"
)

// now is the fixtures' clock.
var now = time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)

// pod is an injected pod whose sidecar has env, as injection writes it.
func pod(name string, env map[string]string, edit ...func(*corev1.Pod)) corev1.Pod {
	var vars []corev1.EnvVar
	for _, k := range []string{"HANDOFF_LEASES", "HANDOFF_ROLE_LEASES", "HANDOFF_SHARDS", "HANDOFF_SHARD_PEERS"} {
		if v, ok := env[k]; ok {
			vars = append(vars, corev1.EnvVar{Name: k, Value: v})
		}
	}
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", UID: types.UID(name + "-uid"),
			Annotations: map[string]string{inject.AnnotationVersion: "v0.2.0"}},
		Spec: corev1.PodSpec{InitContainers: []corev1.Container{{Name: inject.SidecarName, Env: vars}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	for _, e := range edit {
		e(&p)
	}
	return p
}

// orders is the environment of a workload's sidecars: a role Lease, a
// partition Lease and a shard set of 4.
var orders = map[string]string{"HANDOFF_LEASES": "orders-leader,orders-audit", "HANDOFF_ROLE_LEASES": "orders-leader",
	"HANDOFF_SHARDS": "orders-{0..3}", "HANDOFF_SHARD_PEERS": "app=orders"}

// lease is a Lease held by holder (a pod of the fixtures, or any
// identity), renewed ago before now, with a 15 s duration.
func lease(name, holder string, ago time.Duration, transitions int32) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: coordinationv1.LeaseSpec{
		HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](15), LeaseTransitions: ptr.To(transitions),
		RenewTime: ptr.To(metav1.NewMicroTime(now.Add(-ago)))}}
}

func event(p corev1.Pod, reason, message string, at time.Time) corev1.Event {
	return corev1.Event{InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: p.Name, UID: p.UID}, Reason: reason, Message: message,
		LastTimestamp: metav1.NewTime(at)}
}

// buildStatus, from objects alone: each Lease's state (Held, Free,
// Expired, Missing) and kind, the shard sets' owners and fair share, and
// each pod's phase (inferred, or the sidecar's) and last handover.
func TestBuildStatus(t *testing.T) {
	a := pod("orders-a", orders)
	b := pod("orders-b", orders, func(p *corev1.Pod) { p.DeletionTimestamp = ptr.To(metav1.NewTime(now.Add(-5 * time.Second))) })
	c := pod("orders-c", orders, func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: protocol.PodConditionCoordinating, Reason: string(protocol.PhaseRearming)})
		p.Annotations[corev1.PodDeletionCost] = "10010"
	})
	pending := pod("orders-d", orders, func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending; p.Status.Conditions = nil })
	leases := map[string]*coordinationv1.Lease{
		"orders-leader": lease("orders-leader", "orders-a_orders-a-uid", time.Second, 4),
		"orders-audit":  lease("orders-audit", "orders-b_orders-b-uid", time.Minute, 2), // not renewed for a minute
		"orders-0":      lease("orders-0", "orders-a_orders-a-uid", 2*time.Second, 1),
		"orders-1":      lease("orders-1", "orders-b_orders-b-uid", 2*time.Second, 1),
		"orders-2":      lease("orders-2", "someone-else", 2*time.Second, 1),
		"orders-3":      {ObjectMeta: metav1.ObjectMeta{Name: "orders-3"}, Spec: coordinationv1.LeaseSpec{LeaseTransitions: ptr.To[int32](3)}}, // released
	}
	events := []corev1.Event{
		event(b, coord.ReasonDrainStarted, "draining 2 claims", now.Add(-4*time.Second)),
	}
	r := buildStatus(now, "shop", "handoff.dev/injected=true", []corev1.Pod{pending, c, b, a}, events, leases)

	held := func(v LeaseView, left float64, renewed time.Duration) LeaseView {
		v.State, v.TermLeftSeconds, v.LeaseDurationSeconds = leaseHeld, left, 15
		v.RenewTime = ptr.To(now.Add(-renewed))
		return v
	}
	expired := LeaseView{Name: "orders-audit", Kind: protocol.LeaseKindPartition, State: leaseExpired, HolderIdentity: "orders-b_orders-b-uid",
		HolderPod: "orders-b", FencingToken: 2, LeaseDurationSeconds: 15, RenewTime: ptr.To(now.Add(-time.Minute))}
	wantLeases := []LeaseView{
		held(LeaseView{Name: "orders-0", Kind: protocol.LeaseKindPartition, HolderIdentity: "orders-a_orders-a-uid", HolderPod: "orders-a", FencingToken: 1}, 13, 2*time.Second),
		held(LeaseView{Name: "orders-1", Kind: protocol.LeaseKindPartition, HolderIdentity: "orders-b_orders-b-uid", HolderPod: "orders-b", FencingToken: 1}, 13, 2*time.Second),
		held(LeaseView{Name: "orders-2", Kind: protocol.LeaseKindPartition, HolderIdentity: "someone-else", FencingToken: 1}, 13, 2*time.Second),
		{Name: "orders-3", Kind: protocol.LeaseKindPartition, State: leaseFree, FencingToken: 3},
		expired,
		held(LeaseView{Name: "orders-leader", Kind: protocol.LeaseKindRole, HolderIdentity: "orders-a_orders-a-uid", HolderPod: "orders-a", FencingToken: 4}, 14, time.Second),
	}
	if !reflect.DeepEqual(r.Leases, wantLeases) {
		t.Errorf("leases:\n got %+v\nwant %+v", r.Leases, wantLeases)
	}
	wantSets := []ShardSetView{{Shards: "orders-{0..3}", Leases: []string{"orders-0", "orders-1", "orders-2", "orders-3"},
		Peers: 3, FairShare: 2, // orders-b is being deleted
		Owners:  []ShardOwner{{Pod: "orders-a", Shards: []string{"orders-0"}}, {Pod: "orders-b", Shards: []string{"orders-1"}}},
		Unowned: []string{"orders-2", "orders-3"}}}
	if !reflect.DeepEqual(r.ShardSets, wantSets) {
		t.Errorf("shard sets:\n got %+v\nwant %+v", r.ShardSets, wantSets)
	}
	type podWant struct {
		name, phase, from string
		ready             bool
		leases            []string
		handover          string
		cost              *int32
	}
	var got []podWant
	for _, p := range r.Pods {
		h := ""
		if p.LastHandover != nil {
			h = p.LastHandover.Outcome
		}
		got = append(got, podWant{p.Name, p.Phase, p.PhaseFrom, p.Ready, p.Leases, h, p.DeletionCost})
	}
	want := []podWant{
		{"orders-a", phaseRunning, phaseInferred, true, []string{"orders-0", "orders-leader"}, "", nil}, // in name order
		{"orders-b", phaseShuttingDown, phaseInferred, true, []string{"orders-1"}, handoverInProgress, nil},
		{"orders-c", phaseRearming, phaseFromSidecar, true, []string{}, "", ptr.To[int32](10010)},
		{"orders-d", string(corev1.PodPending), phaseInferred, false, []string{}, "", nil},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("pods:\n got %+v\nwant %+v", got, want)
	}
	if r.Time != now || r.Namespace != "shop" || r.Selector != "handoff.dev/injected=true" {
		t.Errorf("view at %s of %s (%s), want %s, shop, handoff.dev/injected=true", r.Time, r.Namespace, r.Selector, now)
	}
}

// A pod whose sidecar settings do not load (config.Load refuses them, as
// the sidecar would) names no Lease; one without handoff settings none
// either, and neither makes a shard set.
func TestBuildStatusSkipsSettingsTheSidecarRefuses(t *testing.T) {
	bad := pod("bad", map[string]string{"HANDOFF_LEASES": "orders-leader", "HANDOFF_SHARDS": "orders-{0..3}"}) // no shard-peers
	none := pod("none", nil)
	r := buildStatus(now, "shop", "", []corev1.Pod{bad, none}, nil, nil)
	if len(r.Leases) != 0 || len(r.ShardSets) != 0 || len(r.Pods) != 2 {
		t.Errorf("leases %+v, shard sets %+v, %d pods; want none, none, 2", r.Leases, r.ShardSets, len(r.Pods))
	}
}

// lastHandover: the outcome from which Events there are, the steps in the
// order the sequence writes them within a second, and only those after
// the last Rearmed.
func TestLastHandover(t *testing.T) {
	p := pod("p", nil)
	at := func(s int) time.Time { return now.Add(time.Duration(s) * time.Second) }
	for _, tc := range []struct {
		name    string
		events  []corev1.Event
		outcome string
		steps   []string
	}{
		{"none", nil, "", nil},
		{"under way", []corev1.Event{event(p, coord.ReasonDrainStarted, "", at(0))}, handoverInProgress, []string{coord.ReasonDrainStarted}},
		{"drained, in one second", []corev1.Event{event(p, coord.ReasonLeaseReleased, "", at(0)), event(p, coord.ReasonDrained, "", at(0)), event(p, coord.ReasonDrainStarted, "", at(0))},
			string(protocol.OutcomeDrained), []string{coord.ReasonDrainStarted, coord.ReasonDrained, coord.ReasonLeaseReleased}},
		{"returned at the deadline", []corev1.Event{event(p, coord.ReasonDrainStarted, "", at(0)), event(p, coord.ReasonDeadlineExceeded, "fallback return", at(9))},
			string(protocol.OutcomeReturned), []string{coord.ReasonDrainStarted, coord.ReasonDeadlineExceeded}},
		{"abandoned", []corev1.Event{event(p, coord.ReasonDrainStarted, "", at(0)), event(p, coord.ReasonDeadlineExceeded, "fallback abandon", at(9))},
			string(protocol.OutcomeAbandoned), []string{coord.ReasonDrainStarted, coord.ReasonDeadlineExceeded}},
		{"failed release", []corev1.Event{event(p, coord.ReasonDrained, "", at(0)), event(p, coord.ReasonReleaseWithheld, "", at(1))},
			handoverFailed, []string{coord.ReasonDrained, coord.ReasonReleaseWithheld}},
		{"app gone", []corev1.Event{event(p, coord.ReasonLeaseReleased, "", at(0))}, string(protocol.OutcomeAppGone), []string{coord.ReasonLeaseReleased}},
		{"rearmed since", []corev1.Event{event(p, coord.ReasonDrained, "", at(0)), event(p, coord.ReasonRearmed, "", at(1))}, "", nil},
		{"after a rearm", []corev1.Event{event(p, coord.ReasonDrained, "", at(0)), event(p, coord.ReasonRearmed, "", at(1)), event(p, coord.ReasonDrainStarted, "", at(2))},
			handoverInProgress, []string{coord.ReasonDrainStarted}},
	} {
		h := lastHandover(tc.events)
		var outcome string
		var steps []string
		if h != nil {
			outcome = h.Outcome
			for _, s := range h.Steps {
				steps = append(steps, s.Reason)
			}
		}
		if outcome != tc.outcome || !reflect.DeepEqual(steps, tc.steps) {
			t.Errorf("%s: outcome %q, steps %v; want %q, %v", tc.name, outcome, steps, tc.outcome, tc.steps)
		}
	}
}
