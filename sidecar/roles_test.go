package sidecar_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/prestop"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/sidecar"
	"github.com/handoff-dev/handoff/worker"
)

const role = "cron"

// A role Lease goes to the standby while the leaver still drains; the
// partition Lease stays with the leaver until its drain is over.
func TestRoleLeaseIsHandedOverBeforeTheDrainPartitionAfter(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	values := map[string]string{"leases": lease + "," + role, "role-leases": role}
	a := newPod(t, ns, "pod-a", values, worker.Options{})
	kubetest.WaitFor(t, 10*time.Second, "pod-a's app to lead both Leases", func() bool {
		_, r := a.agent.Leader(role)
		return a.leads() && r
	})
	b := newPod(t, ns, "pod-b", values, worker.Options{})
	// One claim that finishes only when the test says.
	_, finish, err := a.agent.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	reports := make(chan *protocol.Report, 1)
	go func() {
		rep, err := a.c.Shutdown(context.Background(), prestop.TriggerPreStop)
		if err != nil {
			t.Error(err)
		}
		reports <- rep
	}()

	kubetest.WaitFor(t, 5*time.Second, "pod-b's app to lead the role Lease "+role, func() bool {
		_, ok := b.agent.Leader(role)
		return ok
	})
	if n := a.agent.InFlight(); n != 1 {
		t.Fatalf("pod-a has %d claims in flight when pod-b leads %s, want its drain still under way with 1", n, role)
	}
	if _, ok := a.agent.Leader(role); ok {
		t.Errorf("pod-a's app still leads %s while pod-b does", role)
	}
	l, err := env.Client.CoordinationV1().Leases(ns).Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := *l.Spec.HolderIdentity; !strings.HasPrefix(h, "pod-a_") || !a.leads() {
		t.Errorf("partition Lease %s held by %q during pod-a's drain (pod-a's app leads: %t); want pod-a", lease, h, a.leads())
	}
	st := a.c.Status()
	for _, ls := range st.Leases {
		want := protocol.LeaseKindPartition
		if ls.Lease == role {
			want = protocol.LeaseKindRole
		}
		if ls.Kind != want || (ls.Lease == role) == ls.ReleasedAt.IsZero() {
			t.Errorf("status of %s during the drain: kind %s, released at %s; want kind %s, released only if a role", ls.Lease, ls.Kind, ls.ReleasedAt, want)
		}
	}

	finish()
	rep := <-reports
	if rep == nil {
		t.FailNow()
	}
	var drained time.Time
	for _, s := range rep.Steps {
		if s.Name == sidecar.StepDrained {
			drained = s.At
		}
	}
	byName := map[string]protocol.LeaseRelease{}
	for _, r := range rep.Leases {
		byName[r.Lease] = r
	}
	if r := byName[role]; r.Kind != protocol.LeaseKindRole || !r.Released || !r.ReleasedAt.Before(drained) {
		t.Errorf("role Lease in the report: %+v; want kind role, released before the drain ended at %s", r, drained)
	}
	if r := byName[lease]; r.Kind != protocol.LeaseKindPartition || !r.Released || r.ReleasedAt.Before(drained) {
		t.Errorf("partition Lease in the report: %+v; want kind partition, released after the drain ended at %s", r, drained)
	}
	kubetest.WaitFor(t, 5*time.Second, "pod-b's app to lead "+lease, b.leads)
	// The Events are written in the background, after the report.
	for _, w := range []string{"Lease " + role + " (role) released at ", "Lease " + lease + " (partition) released at "} {
		kubetest.WaitFor(t, 10*time.Second, "a LeaseReleased Event saying "+w, func() bool {
			return strings.Contains(strings.Join(events(t, ns, "pod-a", sidecar.ReasonLeaseReleased), "\n"), w)
		})
	}
}
