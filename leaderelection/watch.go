package leaderelection

import (
	"context"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/cache"
)

// leaseWatch keeps the latest version of one Lease from a list and watch
// of that Lease alone (field selector on its name), and wakes waiters when
// it changes.
type leaseWatch struct {
	informer cache.SharedIndexInformer
	key      string

	mu      sync.Mutex
	events  uint64        // events seen so far
	changed chan struct{} // closed at the next event
}

// trace, if set, is called with HopFreeSeen when an event shows the Lease
// free.
func newLeaseWatch(leases coordinationv1client.LeaseInterface, namespace, name string, trace func(Hop)) *leaseWatch {
	byName := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = byName
			return leases.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = byName
			return leases.Watch(ctx, o)
		},
	}
	w := &leaseWatch{
		informer: cache.NewSharedIndexInformer(lw, &coordinationv1.Lease{}, 0, cache.Indexers{}),
		key:      namespace + "/" + name,
		changed:  make(chan struct{}),
	}
	// Registered before Run, so it cannot fail.
	_, _ = w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.seen(obj, trace); w.notify() },
		UpdateFunc: func(_, obj any) { w.seen(obj, trace); w.notify() },
		DeleteFunc: func(any) {
			if trace != nil {
				trace(HopFreeSeen)
			}
			w.notify()
		},
	})
	return w
}

// run lists and watches until ctx ends, re-establishing the watch as
// client-go's reflector does.
func (w *leaseWatch) run(ctx context.Context) { w.informer.RunWithContext(ctx) }

// seen calls trace with HopFreeSeen when obj is a Lease with no holder.
func (w *leaseWatch) seen(obj any, trace func(Hop)) {
	if trace == nil {
		return
	}
	if l, ok := obj.(*coordinationv1.Lease); ok && (l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "") {
		trace(HopFreeSeen)
	}
}

func (w *leaseWatch) notify() {
	w.mu.Lock()
	w.events++
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

// synced is closed when the first list has completed.
func (w *leaseWatch) synced() <-chan struct{} { return w.informer.HasSyncedChecker().Done() }

// current returns the Lease as last seen (nil when it does not exist),
// whether the first list has completed, the number of events seen, and a
// channel closed at the next event.
func (w *leaseWatch) current() (lease *coordinationv1.Lease, synced bool, events uint64, next <-chan struct{}) {
	w.mu.Lock()
	events, next = w.events, w.changed
	w.mu.Unlock()
	if !w.informer.HasSynced() {
		return nil, false, events, next
	}
	if obj, ok, _ := w.informer.GetStore().GetByKey(w.key); ok {
		lease = obj.(*coordinationv1.Lease)
	}
	return lease, true, events, next
}
