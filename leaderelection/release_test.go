package leaderelection_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/util/retry"

	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/leaderelection"
)

// meddled is a holder's Lease client that, while armed, has another client
// write the Lease (add a label, as a tool would) right after each of the
// holder's reads from the API, or after its writes of its record, so the
// holder's next write meets a real conflict (409) on the apiserver.
type meddled struct {
	coordinationv1client.LeasesGetter
	t      *testing.T
	reads  atomic.Int64 // reads still to be followed by a meddling write
	writes atomic.Int64 // renewals still to be followed by one
	// releases counts release writes (empty holder identity); conflicts
	// those answered 409.
	releases, conflicts atomic.Int64
}

func (m *meddled) Leases(ns string) coordinationv1client.LeaseInterface {
	return &meddledClient{LeaseInterface: m.LeasesGetter.Leases(ns), m: m}
}

type meddledClient struct {
	coordinationv1client.LeaseInterface
	m *meddled
}

func (c *meddledClient) Get(ctx context.Context, name string, o metav1.GetOptions) (*coordinationv1.Lease, error) {
	out, err := c.LeaseInterface.Get(ctx, name, o)
	if err == nil && c.m.reads.Add(-1) >= 0 {
		labelLease(c.m.t, out.Namespace)
	}
	return out, err
}

func (c *meddledClient) Update(ctx context.Context, lease *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	out, err := c.LeaseInterface.Update(ctx, lease, o)
	if err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "" && c.m.writes.Add(-1) >= 0 {
		labelLease(c.m.t, out.Namespace)
	}
	if lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity == "" {
		c.m.releases.Add(1)
		if apierrors.IsConflict(err) {
			c.m.conflicts.Add(1)
		}
	}
	return out, err
}

var labelSeq atomic.Int64

// labelLease writes the Lease from the test's own client: a new label.
func labelLease(t *testing.T, ns string) {
	leases := kubetest.Get(t).Client.CoordinationV1().Leases(ns)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := leases.Get(context.Background(), leaseName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Labels == nil {
			l.Labels = map[string]string{}
		}
		l.Labels["meddled"] = strconv.FormatInt(labelSeq.Add(1), 10)
		_, err = leases.Update(context.Background(), l, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Errorf("labelling the Lease: %v", err)
	}
}

// A write by anyone else between the holder's last renewal and its
// release write (a tool adding a label, a late renewal) makes the write
// meet a conflict: the release's read is answered from the renewal, so the
// write carries the renewal's resourceVersion. The holder re-reads from the
// API and releases while the Lease still names it.
func TestReleaseAfterConflictIsWritten(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	api := &meddled{LeasesGetter: env.Client.CoordinationV1(), t: t}
	a := startWith(t, ns, "pod-a_uid-a", api)
	kubetest.WaitFor(t, 10*time.Second, "a to hold the Lease", func() bool { return holding(a) })

	// After every renewal from now, so whenever the release comes, the
	// renewal before it was followed by another write.
	api.writes.Store(1 << 30)
	kubetest.WaitFor(t, 5*time.Second, "a renewal followed by another client's write", func() bool { return api.writes.Load() < 1<<30 })
	a.stop()
	if api.conflicts.Load() == 0 {
		t.Fatalf("no release write met a conflict (%d release writes): the test did not put a write before it", api.releases.Load())
	}
	if !a.e.Released() || a.e.ReleaseErr() != nil {
		t.Fatalf("after a conflict: released %t, ReleaseErr %v; want released, nil", a.e.Released(), a.e.ReleaseErr())
	}
	l := getLease(t, ns)
	if got := *l.Spec.HolderIdentity; got != "" {
		t.Errorf("Lease holder after the release = %q, want empty", got)
	}
	if l.Labels["meddled"] == "" {
		t.Error("the other client's label is gone: the release wrote over it")
	}
}

// A Lease written by someone else after every read of the holder is not
// fought over for the whole renew deadline: the release gives up after a
// few writes and says why.
func TestReleaseGivesUpAfterAFewConflicts(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	api := &meddled{LeasesGetter: env.Client.CoordinationV1(), t: t}
	a := startWith(t, ns, "pod-a_uid-a", api)
	kubetest.WaitFor(t, 10*time.Second, "a to hold the Lease", func() bool { return holding(a) })

	api.reads.Store(1 << 30)
	api.writes.Store(1 << 30)
	kubetest.WaitFor(t, 5*time.Second, "a renewal followed by another client's write", func() bool { return api.writes.Load() < 1<<30 })
	a.stop()
	if a.e.Released() {
		t.Fatal("released although every release write met a conflict")
	}
	err := a.e.ReleaseErr()
	if err == nil || !strings.Contains(err.Error(), "conflict") {
		t.Fatalf("ReleaseErr = %v, want it to say the writes met conflicts", err)
	}
	// The bound is 5 writes (maxReleaseWrites); client-go alone would go
	// on until its release context of one renew deadline ends.
	if n := api.releases.Load(); n > 5 {
		t.Errorf("%d release writes, want at most 5", n)
	}
	if got := *getLease(t, ns).Spec.HolderIdentity; got != "pod-a_uid-a" {
		t.Errorf("Lease holder = %q, want pod-a_uid-a, left to expire", got)
	}
}

// takeLease makes the Lease name identity, as a candidate that took it
// while the holder was cut off would, with a lease duration of a minute.
func takeLease(t *testing.T, ns, identity string) {
	t.Helper()
	leases := kubetest.Get(t).Client.CoordinationV1().Leases(ns)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := leases.Get(context.Background(), leaseName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now, sixty, transitions := metav1.NewMicroTime(time.Now()), int32(60), *l.Spec.LeaseTransitions+1
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.LeaseTransitions = &identity, &sixty, &transitions
		l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
		_, err = leases.Update(context.Background(), l, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("taking the Lease for %s: %v", identity, err)
	}
}

// A holder never frees a Lease another holder has taken: whether it is
// cancelled at once or its renewals find the new holder first, the
// release is not written and ReleaseErr names the holder.
func TestReleaseNeverFreesAnotherHoldersLease(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cancel bool // at once, before a renewal reads the new holder
	}{{"cancelled", true}, {"renewal finds the new holder", false}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := kubetest.Get(t).Namespace(t)
			a := start(t, ns, "pod-a_uid-a")
			kubetest.WaitFor(t, 10*time.Second, "a to hold the Lease", func() bool { return holding(a) })

			takeLease(t, ns, "pod-x_uid-x")
			if tc.cancel {
				a.stop()
			} else {
				// client-go gives up renewing after the renew deadline and
				// then attempts the release.
				kubetest.WaitFor(t, 3*renewDeadline, "a's release attempt after its renewals failed", func() bool { return a.e.ReleaseErr() != nil })
				if leading(a) {
					t.Error("a still has a term after its renewals found another holder")
				}
			}
			if a.e.Released() {
				t.Fatal("a wrote a release over another holder's Lease")
			}
			if err := a.e.ReleaseErr(); err == nil || !strings.Contains(err.Error(), "pod-x_uid-x") {
				t.Errorf("ReleaseErr = %v, want it to name the holder pod-x_uid-x", err)
			}
			if got := *getLease(t, ns).Spec.HolderIdentity; got != "pod-x_uid-x" {
				t.Errorf("Lease holder = %q, want pod-x_uid-x", got)
			}
		})
	}
}

// ReleaseLeftover frees a Lease only while it names the identity, and the
// next acquisition by that identity is a new transition (a greater fencing
// token); another holder's Lease and a missing one are left alone.
func TestReleaseLeftover(t *testing.T) {
	env := kubetest.Get(t)
	ns := env.Namespace(t)
	leases := env.Client.CoordinationV1()
	create := func(name, holder string) { t.Helper(); createHeldLease(t, leases, ns, name, holder) }
	create("mine", "pod-a_uid-a")
	create("theirs", "pod-b_uid-b")
	for _, tc := range []struct {
		lease, holder string
		released      bool
	}{
		{"mine", "", true},
		{"theirs", "pod-b_uid-b", false},
		{"missing", "", false},
	} {
		released, err := leaderelection.ReleaseLeftover(context.Background(), leases, ns, tc.lease, "pod-a_uid-a", time.Second)
		if err != nil || released != tc.released {
			t.Errorf("ReleaseLeftover(%s) = %t, %v; want %t", tc.lease, released, err, tc.released)
		}
		l, err := leases.Leases(ns).Get(context.Background(), tc.lease, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if h := *l.Spec.HolderIdentity; h != tc.holder || *l.Spec.LeaseTransitions != 4 {
			t.Errorf("Lease %s: holder %q, transitions %d; want %q, 4", tc.lease, h, *l.Spec.LeaseTransitions, tc.holder)
		}
	}
	// The same identity now acquires with a new transition.
	cfg := config(env.Client, ns, "pod-a_uid-a")
	cfg.Name = "mine"
	startConfig(t, cfg)
	var token int64
	kubetest.WaitFor(t, 10*time.Second, "pod-a to lead mine again", func() bool {
		l, err := leases.Leases(ns).Get(context.Background(), "mine", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "pod-a_uid-a" {
			return false
		}
		token = int64(*l.Spec.LeaseTransitions)
		return true
	})
	if token != 5 {
		t.Errorf("pod-a took the released Lease with leaseTransitions %d; want 5, a new transition", token)
	}
}

func ptrTo[T any](v T) *T { return &v }
