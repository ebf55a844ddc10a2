package sidecar_test

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/internal/outcome"
	"github.com/handoff-dev/handoff/leaderelection"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/worker"
)

// candidatePod creates an injected pod object that competes for lease, of
// revision rev, Running and Ready, and starts its sidecar; a non-nil
// leases is its Lease client.
func candidatePod(t *testing.T, ns, name, rev string, values map[string]string, leases *slowLeaseWrites) *pod {
	t.Helper()
	env := kubetest.Get(t)
	grace := int64(30)
	obj, err := env.Client.CoreV1().Pods(ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels:      map[string]string{"app": "orders", "pod-template-hash": rev, "handoff.dev/injected": "true"},
			Annotations: map[string]string{"handoff.dev/leases": lease}},
		Spec: corev1.PodSpec{NodeName: "node-1", TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "worker", Image: "worker"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setReady(t, obj, true)
	if leases == nil { // a nil *slowLeaseWrites is no nil interface
		return startPod(t, obj, values, worker.Options{}, nil)
	}
	return startPod(t, obj, values, worker.Options{}, leases)
}

// A leaving leader's Lease goes to the pod of the new revision, not to the
// old pod that a rolling update deletes next, though the old one's writes
// are quicker: one move per rollout. The Lease names the successor in the
// release, the successor's app gets a greater fencing token, and the old
// standby's app is never told it leads.
func TestReleaseGoesToThePodThatStays(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	a := candidatePod(t, ns, "orders-old-a", "old", nil, nil)
	kubetest.WaitFor(t, 10*time.Second, "orders-old-a's app to lead", a.leads)
	before, _ := a.agent.Leader(lease)
	b := candidatePod(t, ns, "orders-old-b", "old", nil, nil)
	c := candidatePod(t, ns, "orders-new-c", "new", nil, slowWrites(t, 150*time.Millisecond))

	// The release's own write, seen by a watch of the Lease.
	w, err := env.Client.CoordinationV1().Leases(ns).Watch(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if _, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop); err != nil {
		t.Fatal(err)
	}
	kubetest.WaitFor(t, 5*time.Second, "orders-new-c's app to lead", c.leads)
	if b.calls.grantsSince(time.Time{}) > 0 {
		t.Errorf("orders-old-b's app was told it leads (grants %d); want the Lease to go to orders-new-c only", b.calls.grantsSince(time.Time{}))
	}
	after, _ := c.agent.Leader(lease)
	if after.FencingToken <= before.FencingToken {
		t.Errorf("successor's fencing token %d, want more than %d", after.FencingToken, before.FencingToken)
	}
	named := ""
	for named == "" {
		select {
		case ev := <-w.ResultChan():
			if l, ok := ev.Object.(interface{ GetAnnotations() map[string]string }); ok {
				named = l.GetAnnotations()[leaderelection.AnnotationSuccessor]
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no Lease write named a successor")
		}
	}
	if want := c.settings.Identity(); named != want {
		t.Errorf("the release named %q, want %q", named, want)
	}
	// The summary times the release hop by hop: the revoke, the pick and
	// the release write, each in its order.
	sum, _ := summary(t, ns, "orders-old-a")
	if len(sum.Leases) != 1 || sum.Leases[0].Successor != outcome.SuccessorNamed {
		t.Fatalf("summary's leases %+v, want %s with its successor named", sum.Leases, lease)
	}
	hops := sum.Leases[0].Hops
	for _, order := range [][2]outcome.Hop{{outcome.HopRevokeSent, outcome.HopRevokeAcked}, {outcome.HopRevokeAcked, outcome.HopReleaseSent},
		{outcome.HopSuccessorPicked, outcome.HopReleaseSent}, {outcome.HopReleaseSent, outcome.HopReleaseAcked}} {
		first, ok1 := hops[order[0]]
		then, ok2 := hops[order[1]]
		if !ok1 || !ok2 || first > then {
			t.Errorf("hops %v: want %s (%v) at or before %s (%v)", hops, order[0], first, order[1], then)
		}
	}
	if _, ok := hops[outcome.HopSuccessorGivenUp]; ok {
		t.Errorf("hops %v: the release gave up on a pick that named a successor", hops)
	}
	kubetest.WaitFor(t, 5*time.Second, "an Event of the release naming its successor", func() bool {
		evs, err := env.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			if e.Reason == "LeaseReleased" && strings.Contains(e.Message, "naming successor "+named+"; from the start: revoke sent +") {
				return true
			}
		}
		return false
	})
}

// slowLeaseWrites is a Lease client whose Updates each wait d first: a
// candidate that loses every race.
type slowLeaseWrites struct {
	coordinationv1client.LeasesGetter
	d time.Duration
}

func slowWrites(t *testing.T, d time.Duration) *slowLeaseWrites {
	return &slowLeaseWrites{kubetest.Get(t).Client.CoordinationV1(), d}
}

func (s *slowLeaseWrites) Leases(ns string) coordinationv1client.LeaseInterface {
	return slowLease{s.LeasesGetter.Leases(ns), s.d}
}

type slowLease struct {
	coordinationv1client.LeaseInterface
	d time.Duration
}

func (s slowLease) Update(ctx context.Context, l *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	time.Sleep(s.d)
	return s.LeaseInterface.Update(ctx, l, o)
}
