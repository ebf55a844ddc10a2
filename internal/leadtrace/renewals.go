package leadtrace

import (
	"context"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// Renewals watches the Leases of one namespace and records, per Lease, the
// longest time between two successive renew times written by the same
// holder, the renew time of the holder's last write counted up to now too.
// Renew times are the holders' own stamps (spec.renewTime, microseconds).
type Renewals struct {
	mu     sync.Mutex
	leases map[string]*renewals
	done   chan struct{}
}

type renewals struct {
	holder string
	last   time.Time
	maxGap time.Duration
	writes int
	// released is the renew time of the last release record (no holder).
	released time.Time
	// acquired is the acquire time of the current holder's record.
	acquired time.Time
}

// WatchRenewals starts watching namespace's Leases until ctx ends; it
// returns once the first list is in. Done is closed once the watch stopped.
func WatchRenewals(ctx context.Context, client kubernetes.Interface, namespace string) *Renewals {
	r := &Renewals{leases: map[string]*renewals{}, done: make(chan struct{})}
	lw := cache.NewListWatchFromClient(client.CoordinationV1().RESTClient(), "leases", namespace, fields.Everything())
	inf := cache.NewSharedIndexInformer(lw, &coordinationv1.Lease{}, 0, cache.Indexers{})
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.saw(o.(*coordinationv1.Lease)) },
		UpdateFunc: func(_, o any) { r.saw(o.(*coordinationv1.Lease)) },
	})
	go func() { inf.RunWithContext(ctx); close(r.done) }()
	cache.WaitForCacheSync(ctx.Done(), inf.HasSynced)
	return r
}

// Done is closed when the watch has stopped (after its ctx ended): a test
// waits on it so that no informer of its own logs into the next test.
func (r *Renewals) Done() <-chan struct{} { return r.done }

func (r *Renewals) saw(l *coordinationv1.Lease) {
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	if l.Spec.RenewTime == nil {
		return
	}
	at := l.Spec.RenewTime.Time
	r.mu.Lock()
	defer r.mu.Unlock()
	x := r.leases[l.Name]
	if x == nil {
		x = &renewals{}
		r.leases[l.Name] = x
	}
	if holder == "" {
		// A release: client-go's record stamps it when written.
		x.released, x.holder = at, ""
		return
	}
	if x.holder == holder && at.After(x.last) {
		x.maxGap = max(x.maxGap, at.Sub(x.last))
	}
	if x.holder != holder && l.Spec.AcquireTime != nil {
		x.acquired = l.Spec.AcquireTime.Time
	}
	if x.holder != holder || at.After(x.last) {
		x.holder, x.last = holder, at
		x.writes++
	}
}

// Gaps is the longest renewal gap of each Lease with a holder, the time
// since its last renewal included, and the number of renewals seen.
func (r *Renewals) Gaps(now time.Time) (gaps map[string]time.Duration, writes int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	gaps = make(map[string]time.Duration, len(r.leases))
	for name, x := range r.leases {
		if x.holder == "" {
			gaps[name] = x.maxGap
			continue
		}
		gaps[name] = max(x.maxGap, now.Sub(x.last))
		writes += x.writes
	}
	return gaps, writes
}

// Reset forgets the gaps seen so far (not the last renewal of each Lease):
// the next Gaps counts from here.
func (r *Renewals) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range r.leases {
		x.maxGap, x.writes = 0, 0
	}
}

// Released is the renew time written by the last release of name (the
// holder's clock, as it wrote the release), zero if none was seen.
func (r *Renewals) Released(name string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if x := r.leases[name]; x != nil {
		return x.released
	}
	return time.Time{}
}

// Acquired is the acquire time of the record of name's current holder (its
// clock, as it wrote the record), and that holder; zero and "" if none.
func (r *Renewals) Acquired(name string) (time.Time, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if x := r.leases[name]; x != nil && x.holder != "" {
		return x.acquired, x.holder
	}
	return time.Time{}, ""
}
