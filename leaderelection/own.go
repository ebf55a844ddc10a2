package leaderelection

import (
	"context"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// ownWrite is the Lease as the apiserver answered one Run's last request
// of it, when that request was a successful write of the Run's own: the
// standby phase's acquiring write, or a renewal of the holder phase. It is
// shared by both phases, so that what one phase wrote answers the next
// phase's first read (see ownLeases) and lets the holder's elector skip a
// renewal of a record just written (see observedLock.Update).
//
// A record answered in place of a read can only be stale by a write of
// someone else since; the write that follows it then carries an old
// resourceVersion and the apiserver refuses it (409 Conflict), and
// client-go reads again, from the API: optimistic concurrency keeps it
// safe, as it keeps client-go's own fast-path renewal safe.
type ownWrite struct {
	clock clock.Clock

	mu     sync.Mutex
	lease  *coordinationv1.Lease // nil after any other request (a read from the API, a failed write)
	at     time.Time             // when that write was sent
	unread bool                  // no read has been answered from lease yet
}

func (o *ownWrite) set(lease *coordinationv1.Lease, at time.Time) {
	o.mu.Lock()
	o.lease, o.at, o.unread = lease, at, lease != nil
	o.mu.Unlock()
}

// take returns a copy of the record for a read, once per write.
func (o *ownWrite) take() *coordinationv1.Lease {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.lease == nil || !o.unread {
		return nil
	}
	o.unread = false
	return o.lease.DeepCopy()
}

// recent reports whether the last request was a write, sent less than
// within ago, of holder identity's record with the given transitions and
// lease duration: a renewal of it now would change only its renew time.
func (o *ownWrite) recent(within time.Duration, identity string, transitions, durationSeconds int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.lease == nil || o.clock.Since(o.at) >= within {
		return false
	}
	s := o.lease.Spec
	return ptr.Deref(s.HolderIdentity, "") == identity &&
		int(ptr.Deref(s.LeaseTransitions, 0)) == transitions &&
		int(ptr.Deref(s.LeaseDurationSeconds, 0)) == durationSeconds
}

// ownLeases is a Leases client that records each answer to a write in own;
// with answer set, a Get is answered from the last recorded write when no
// read has been answered from it yet, and goes to the API otherwise. Each
// write carries AnnotationSuccessor as withSuccessor says: a release the
// one successor names, any other write none.
type ownLeases struct {
	coordinationv1client.LeasesGetter
	own       *ownWrite
	answer    bool
	identity  string        // this candidate's holder identity
	successor func() string // Config.Successor; nil for the standby's writes
}

func (c ownLeases) Leases(namespace string) coordinationv1client.LeaseInterface {
	return ownLeaseClient{LeaseInterface: c.LeasesGetter.Leases(namespace), c: c}
}

type ownLeaseClient struct {
	coordinationv1client.LeaseInterface
	c ownLeases
}

func (l ownLeaseClient) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	if l.c.answer {
		if lease := l.c.own.take(); lease != nil && lease.Name == name {
			return lease, nil
		}
	}
	lease, err := l.LeaseInterface.Get(ctx, name, opts)
	l.c.own.set(nil, time.Time{})
	return lease, err
}

func (l ownLeaseClient) Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	at := l.c.own.clock.Now()
	out, err := l.LeaseInterface.Create(ctx, withSuccessor(lease, l.c.identity, l.c.successor), opts)
	l.wrote(out, err, at)
	return out, err
}

func (l ownLeaseClient) Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	at := l.c.own.clock.Now()
	out, err := l.LeaseInterface.Update(ctx, withSuccessor(lease, l.c.identity, l.c.successor), opts)
	l.wrote(out, err, at)
	return out, err
}

func (l ownLeaseClient) wrote(out *coordinationv1.Lease, err error, at time.Time) {
	if err != nil {
		out = nil
	}
	l.c.own.set(out.DeepCopy(), at)
}
