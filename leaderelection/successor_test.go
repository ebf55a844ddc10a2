package leaderelection_test

import (
	"testing"
	"time"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/leaderelection"
)

// A release that names a successor is taken by it, even when another
// standby would win the race: here the other one writes at once and the
// named one 150 ms late. The named one's acquisition clears the annotation
// and gets a greater fencing token; the other never leads.
func TestReleaseNamingASuccessorIsTakenByIt(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	cfg := config(env.Client, ns, "pod-a_uid-a")
	cfg.Successor = func() string { return "pod-c_uid-c" }
	a := startConfig(t, cfg)
	kubetest.WaitFor(t, 10*time.Second, "a to hold the Lease", func() bool { return holding(a) })
	before, _ := a.e.Term()

	b := start(t, ns, "pod-b_uid-b")
	slow := &leases{LeasesGetter: env.Client.CoordinationV1()}
	slow.slowUpdate.Store(int64(150 * time.Millisecond))
	c := startWith(t, ns, "pod-c_uid-c", slow)
	kubetest.WaitFor(t, 10*time.Second, "c's watch to list", slow.listed.Load)

	a.stop()
	if !a.e.Released() {
		t.Fatalf("a did not release the Lease: %v", a.e.ReleaseErr())
	}
	kubetest.WaitFor(t, leaseDuration, "c, the named successor, to lead", func() bool { return leading(c) })
	if terms := b.termsCopy(); len(terms) > 0 {
		t.Errorf("b led (terms %v) after a release naming c", terms)
	}
	after, _ := c.e.Term()
	if after.FencingToken <= before.FencingToken {
		t.Errorf("c's fencing token = %d, want more than a's %d", after.FencingToken, before.FencingToken)
	}
	l := getLease(t, ns)
	if got := *l.Spec.HolderIdentity; got != "pod-c_uid-c" {
		t.Errorf("Lease holder = %q, want pod-c_uid-c", got)
	}
	if v, ok := l.Annotations[leaderelection.AnnotationSuccessor]; ok {
		t.Errorf("Lease held by its successor still has %s: %q", leaderelection.AnnotationSuccessor, v)
	}
}

// A release naming a successor that never takes the Lease (gone, or not a
// candidate) leaves it to the others after the grace: a standby leads, no
// earlier than SuccessorGrace after the release, and well before the lease
// duration.
func TestNamedSuccessorThatDoesNotComeIsReplacedAfterTheGrace(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	cfg := config(env.Client, ns, "pod-a_uid-a")
	cfg.Successor = func() string { return "pod-gone_uid-gone" }
	a := startConfig(t, cfg)
	kubetest.WaitFor(t, 10*time.Second, "a to hold the Lease", func() bool { return holding(a) })
	watched := &leases{LeasesGetter: env.Client.CoordinationV1()}
	b := startWith(t, ns, "pod-b_uid-b", watched)
	kubetest.WaitFor(t, 10*time.Second, "b's watch to list", watched.listed.Load)

	a.stop()
	released := a.endAt
	if !a.e.Released() {
		t.Fatalf("a did not release the Lease: %v", a.e.ReleaseErr())
	}
	kubetest.WaitFor(t, leaseDuration, "b to lead", func() bool { return leading(b) })
	b.mu.Lock()
	took := b.termAt[0].Sub(released)
	b.mu.Unlock()
	t.Logf("b led %s after the release", took)
	if took < leaderelection.SuccessorGrace {
		t.Errorf("b led %s after a release naming another successor, want at least the grace %s", took, leaderelection.SuccessorGrace)
	}
}
