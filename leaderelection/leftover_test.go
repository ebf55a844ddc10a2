package leaderelection_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/leaderelection"
)

// takenAfterRead is a Leases client whose first Get is followed, before it
// returns, by another pod's acquisition of the Lease (a direct write).
type takenAfterRead struct {
	coordinationv1client.LeasesGetter
	other coordinationv1client.LeasesGetter
	ns    string
	by    string
	done  atomic.Bool
	t     *testing.T
}

func (w *takenAfterRead) Leases(ns string) coordinationv1client.LeaseInterface {
	return takenClient{LeaseInterface: w.LeasesGetter.Leases(ns), w: w}
}

type takenClient struct {
	coordinationv1client.LeaseInterface
	w *takenAfterRead
}

func (c takenClient) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	l, err := c.LeaseInterface.Get(ctx, name, opts)
	if err == nil && c.w.done.CompareAndSwap(false, true) {
		o := l.DeepCopy()
		o.Spec.HolderIdentity = &c.w.by
		if _, err := c.w.other.Leases(c.w.ns).Update(ctx, o, metav1.UpdateOptions{}); err != nil {
			c.w.t.Errorf("the other pod's acquisition: %v", err)
		}
	}
	return l, err
}

// A Lease taken by another pod between ReleaseLeftover's read and its
// write, by an identity sharing the pod's prefix, or by holders that only
// look alike, is never freed.
func TestReleaseLeftoverNeverFreesAnotherPodsLease(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	leases := env.Client.CoordinationV1()
	create := func(name, holder string) { t.Helper(); createHeldLease(t, leases, ns, name, holder) }
	const me = "pod-a_uid-a"
	create("raced", me)
	w := &takenAfterRead{LeasesGetter: leases, other: leases, ns: ns, by: "pod-a_uid-a2", t: t}
	freed, err := leaderelection.ReleaseLeftover(context.Background(), w, ns, "raced", me, time.Second)
	if freed {
		t.Errorf("ReleaseLeftover freed a Lease taken by another pod after its read (err %v)", err)
	}
	for i, h := range []string{"pod-a_uid-a2", "pod-a_uid-", "pod-a_", "pod-a", "POD-A_uid-a", " pod-a_uid-a", "pod-a_uid-a "} {
		name := "alike-" + string(rune('a'+i))
		create(name, h)
		if freed, err := leaderelection.ReleaseLeftover(context.Background(), leases, ns, name, me, time.Second); freed || err != nil {
			t.Errorf("ReleaseLeftover of a Lease held by %q = %t, %v: want it left alone", h, freed, err)
		}
	}
	for _, name := range []string{"raced", "alike-a", "alike-b"} {
		l, err := leases.Leases(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if *l.Spec.HolderIdentity == "" {
			t.Errorf("Lease %s freed", name)
		}
	}
}

// annotatedAfterRead is a Leases client after each of whose Gets another
// client writes an annotation on the Lease, before the caller can write:
// an update of the Lease as read then always meets a conflict.
type annotatedAfterRead struct {
	coordinationv1client.LeasesGetter
	writes atomic.Int64
	t      *testing.T
}

func (w *annotatedAfterRead) Leases(ns string) coordinationv1client.LeaseInterface {
	return annotatedClient{LeaseInterface: w.LeasesGetter.Leases(ns), w: w}
}

type annotatedClient struct {
	coordinationv1client.LeaseInterface
	w *annotatedAfterRead
}

func (c annotatedClient) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	l, err := c.LeaseInterface.Get(ctx, name, opts)
	if err == nil {
		o := l.DeepCopy()
		if o.Annotations == nil {
			o.Annotations = map[string]string{}
		}
		o.Annotations["example.com/touched"] = strconv.FormatInt(c.w.writes.Add(1), 10)
		if _, err := c.Update(ctx, o, metav1.UpdateOptions{}); err != nil {
			c.w.t.Errorf("the other client's write: %v", err)
		}
	}
	return l, err
}

// Another client annotates the Lease between each read of the leftover
// release and its write: the release still frees it (a JSON patch that
// tests the holder, not an update of the object as read, which would meet
// a conflict at each attempt), keeping the fencing token and the other
// client's annotation.
func TestReleaseLeftoverThroughAnotherWriter(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	leases := env.Client.CoordinationV1()
	const me = "pod-a_uid-a"
	now := metav1.NewMicroTime(time.Now())
	if _, err := leases.Leases(ns).Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "busy"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptrTo(me), LeaseDurationSeconds: ptrTo[int32](15),
			RenewTime: &now, AcquireTime: &now, LeaseTransitions: ptrTo[int32](4)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w := &annotatedAfterRead{LeasesGetter: leases, t: t}
	freed, err := leaderelection.ReleaseLeftover(context.Background(), w, ns, "busy", me, time.Second)
	if !freed || err != nil {
		t.Fatalf("ReleaseLeftover with the Lease annotated after each read (%d times): freed %t, %v; want freed", w.writes.Load(), freed, err)
	}
	l, err := leases.Leases(ns).Get(context.Background(), "busy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptrDeref(l.Spec.HolderIdentity); h != "" || ptrDeref(l.Spec.LeaseTransitions) != 4 || ptrDeref(l.Spec.LeaseDurationSeconds) != 1 {
		t.Errorf("after the release: holder %q, transitions %d, lease duration %d; want no holder, 4 (the fencing token kept), 1", h, ptrDeref(l.Spec.LeaseTransitions), ptrDeref(l.Spec.LeaseDurationSeconds))
	}
	if l.Annotations["example.com/touched"] == "" {
		t.Error("the other client's annotation is gone")
	}
}

func ptrDeref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// createHeldLease creates Lease name in ns held by holder, renewed now for
// 15 s, at its fourth transition: a Lease left by a process that is gone.
func createHeldLease(t *testing.T, leases coordinationv1client.LeasesGetter, ns, name, holder string) {
	t.Helper()
	now := metav1.NewMicroTime(time.Now())
	_, err := leases.Leases(ns).Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: ptrTo[int32](15),
			RenewTime: &now, AcquireTime: &now, LeaseTransitions: ptrTo[int32](4)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}
