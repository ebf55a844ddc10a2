package sidecar

import (
	"context"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/handoff-dev/handoff/leaderelection"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/shard"
)

// peerWatch lists and watches the pods that share the shard set (the
// shard-peers label selector, in the pod's namespace): one list, then one
// watch, re-established by client-go's reflector.
type peerWatch struct {
	informer cache.SharedIndexInformer
	changed  chan struct{} // poked at every event
}

func newPeerWatch(pods corev1client.PodsGetter, namespace, selector string) *peerWatch {
	api := pods.Pods(namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return api.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return api.Watch(ctx, o)
		},
	}
	w := &peerWatch{
		informer: cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{}),
		changed:  make(chan struct{}, 1),
	}
	// Registered before Run, so it cannot fail.
	_, _ = w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke(w.changed) },
		UpdateFunc: func(any, any) { poke(w.changed) },
		DeleteFunc: func(any) { poke(w.changed) },
	})
	return w
}

// up returns the peers that are up, with what each published that it
// holds of shards (its condition protocol.PodConditionShards), and false
// until the first list has completed. A peer is up when it is not being
// deleted, its phase is Running and its Ready condition is True
// (docs/shards.md). A peer with no such condition, or one that does not
// read as shard.EncodeHeld's text of this shard set, counts as holding
// none.
func (w *peerWatch) up(shards []string) ([]shard.Peer, bool) {
	if !w.informer.HasSynced() {
		return nil, false
	}
	var peers []shard.Peer
	for _, obj := range w.informer.GetStore().List() {
		if p, ok := obj.(*corev1.Pod); ok && PeerUp(p) {
			peers = append(peers, shard.Peer{Name: p.Name, Revision: revisionOf(p), Created: p.CreationTimestamp.Time, Held: heldOf(p, shards)})
		}
	}
	slices.SortFunc(peers, func(a, b shard.Peer) int { return cmpString(a.Name, b.Name) })
	return peers, true
}

// heldOf is what pod published that it holds of shards; nil when it
// published nothing readable.
func heldOf(pod *corev1.Pod, shards []string) []string {
	for _, c := range pod.Status.Conditions {
		if c.Type == protocol.PodConditionShards {
			held, err := shard.DecodeHeld(shards, c.Message)
			if err != nil {
				return nil
			}
			return held
		}
	}
	return nil
}

// PeerUp reports whether pod counts among the M pods a shard set is shared
// by: not being deleted, phase Running, condition Ready True.
func PeerUp(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// shardSet is one round's elections of the shard set: the shards this pod
// competes for, holds, or is shedding. Its loop runs from the round's arm
// to its sequence; the sequence then releases what it holds, as it does
// every partition Lease, after the drain.
type shardSet struct {
	mu     sync.Mutex
	active map[string]*lease // shard → its election, running or being shed
	closed bool              // the sequence took the set: no election starts
}

// shardLeases closes r's shard set and returns its elections, in the order
// of the shard set: the sequence releases them with the round's Leases.
func (c *Coordinator) shardLeases(r *round) []*lease {
	if r.shards == nil {
		return nil
	}
	r.shards.mu.Lock()
	defer r.shards.mu.Unlock()
	r.shards.closed = true
	var out []*lease
	for _, name := range c.s.Shards {
		if l := r.shards.active[name]; l != nil {
			out = append(out, l)
		}
	}
	return out
}

// activeShards is a snapshot of r's shard elections, for the status.
func (r *round) activeShards() []*lease {
	if r.shards == nil {
		return nil
	}
	r.shards.mu.Lock()
	defer r.shards.mu.Unlock()
	out := make([]*lease, 0, len(r.shards.active))
	for _, l := range r.shards.active {
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b *lease) int { return cmpString(a.elector.Name(), b.elector.Name()) })
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// runShards keeps r's shard elections to this pod's plan (shard.PlanFor)
// until r's sequence starts or Start's context ends: it competes for the
// shards assigned to it and sheds the ones it holds that are not. It plans
// again at every change of the peers, of a shard's leadership, and at least
// every retry period.
func (c *Coordinator) runShards(r *round) {
	tick := c.clock.NewTicker(c.s.RetryPeriod)
	defer tick.Stop()
	for {
		c.planShards(r)
		select {
		case <-r.shutdown:
			return
		case <-c.base.Done():
			return
		case <-c.peers.changed:
		case <-c.shardWake:
		case <-tick.C():
		}
	}
}

// planShards publishes the shards this pod holds, stops (sheds, if held)
// the elections of the shards not assigned to this pod, then starts those
// of the shards assigned to it, as many as its share leaves room for beside
// the elections it has.
func (c *Coordinator) planShards(r *round) {
	peers, synced := c.peers.up(c.s.Shards)
	if !synced {
		return
	}
	set := r.shards
	set.mu.Lock()
	defer set.mu.Unlock()
	if set.closed || isClosed(r.shutdown) {
		return
	}
	var held []string
	for name, l := range set.active {
		if _, leader := l.elector.Term(); leader {
			held = append(held, name)
		}
	}
	// What it holds, for its peers' plans: written when it changes (each
	// acquisition and end of a term wakes this loop).
	if c.held != nil {
		c.held.setHeld(shard.EncodeHeld(c.s.Shards, held))
	}
	plan := shard.PlanFor(c.s.PodName, c.s.Shards, peers, held)
	c.metrics.ShardShare.Set(float64(plan.Share))
	for name, l := range set.active {
		if slices.Contains(plan.Assigned, name) || l.shedding {
			continue
		}
		l.shedding = true
		_, leader := l.elector.Term()
		if leader {
			c.log.Info("shedding a shard not assigned to this pod", "shard", name, "share", plan.Share, "peers", len(peers))
		}
		c.runs.Add(1)
		go func() {
			defer c.runs.Done()
			c.shed(r, l, leader)
			set.mu.Lock()
			if set.active[name] == l {
				delete(set.active, name)
			}
			set.mu.Unlock()
			poke(c.shardWake)
		}()
	}
	// Then take, up to the share: the elections under way count, the
	// shards being shed too until they are released (their end wakes this
	// loop), so this pod never competes for more than its share.
	room := plan.Share - len(set.active)
	for _, name := range plan.Assigned {
		if set.active[name] != nil {
			continue
		}
		if room <= 0 {
			break
		}
		l, err := c.newLease(r, name, protocol.LeaseKindPartition)
		if err != nil { // the timings were validated in New
			c.log.Error(err, "shard election not started", "shard", name)
			continue
		}
		set.active[name] = l
		c.runLease(l)
		room--
	}
}

// shed ends one shard's election while the pod runs, the way the shutdown
// sequence ends a partition's: no new term reaches the app; a term it was
// granted is revoked, and the Lease is released once the app has
// acknowledged (its work of that shard has stopped) or, without an
// acknowledgement, once the term it was granted has run out; then the
// election ends. A standby that never led just stops competing. A Lease
// the election left naming this pod is then freed (freeShed).
func (c *Coordinator) shed(r *round, l *lease, wasLeader bool) {
	name := l.elector.Name()
	clk := c.clock
	l.mu.Lock()
	l.revoked = true
	granted := l.granted
	if !granted.IsZero() && clk.Now().Before(granted) {
		asked := clk.Now()
		ctx, cancel := context.WithTimeout(context.Background(), granted.Sub(asked))
		err := c.app.SetLeadership(ctx, protocol.Leadership{Lease: name, Leader: false, Sequence: l.nextSequence()})
		cancel()
		c.metrics.appResult("revoke", clk.Since(asked), err)
		if err == nil || protocol.IsAppGone(err) {
			granted = time.Time{}
		} else {
			c.log.Info("revoke of a shed shard not acknowledged: released when the app's term ends", "shard", name, "error", err.Error())
		}
	}
	// Zero once acknowledged; else the sequence, if it starts meanwhile, also
	// waits for the end of the term the app was given.
	l.granted = granted
	l.mu.Unlock()
	l.shed.Store(true)
	if wait := granted.Sub(clk.Now()); !granted.IsZero() && wait > 0 {
		// At most a term: TermLength, under the renew deadline.
		clk.Sleep(wait)
	}
	l.cancel()
	// The shard counts against this pod's share (it stays in the set's
	// active elections) until its Lease no longer names this pod: so the
	// pod never holds more than its share, even while a slow release is
	// under way. The election ends within its release's bound (a few
	// writes, each within leaderelection.RequestTimeout); past twice that,
	// it is reported, and still waited for.
	slow := clk.NewTimer(2 * leaderelection.RequestTimeout(c.s.RenewDeadline))
	defer slow.Stop()
	select {
	case <-l.stopped:
	case <-slow.C():
		c.log.Info("shed shard's election did not end in time: it counts against the share until it does", "shard", name)
		c.event(corev1.EventTypeWarning, ReasonShardShedSlow, "Shard %s: its election did not end within %s of its shed", name, 2*leaderelection.RequestTimeout(c.s.RenewDeadline))
		select {
		case <-l.stopped:
		case <-c.base.Done():
			return
		}
	}
	released, err := l.elector.Released(), error(nil)
	if !released {
		released, err = c.freeShed(r, name)
	}
	if wasLeader {
		c.metrics.ShardsShed.Inc()
		c.log.Info("shard shed", "shard", name, "released", released)
		c.event(corev1.EventTypeNormal, ReasonShardShed, "Shard %s shed (released=%t): assigned to another pod", name, released)
	}
	if err != nil {
		// It may name this pod until it expires, a lease duration after its
		// last renewal at the latest: it counts until then.
		c.log.Info("shed shard's Lease not freed: it counts against the share for a lease duration", "shard", name, "error", err.Error())
		select {
		case <-clk.After(c.s.LeaseDuration):
		case <-r.shutdown: // the set is the sequence's: no plan counts it
		case <-c.base.Done():
		}
	}
}

// freeShed frees the Lease of a shed shard whose election ended without a
// written release, if it still names this pod, and reports whether it
// wrote that release. Such a Lease names the pod when the election's
// release write failed, or when an acquiring write landed whose answer was
// lost (the elector never knew it held the Lease): freed, its assigned pod
// takes it at once, and it no longer counts. The read and write are
// leaderelection.ReleaseLeftover's, each within the elector's request
// timeout, and are abandoned when r's sequence starts (it then owns the
// round's Leases; a re-arm frees what is left before new elections start):
// started already, nothing is sent. The error is the API's, when the Lease
// could be neither read nor freed.
func (c *Coordinator) freeShed(r *round, name string) (bool, error) {
	if isClosed(r.shutdown) {
		// Checked before any request, not only by the goroutine below: a
		// read and write sent before it runs could be answered, and once
		// the sequence has started, a re-arm may have given this pod (the
		// same holder identity) a new term of the Lease, which they would
		// free under the app.
		return false, nil
	}
	ctx, cancel := context.WithCancel(c.base)
	defer cancel()
	go func() {
		select {
		case <-r.shutdown:
			cancel()
		case <-ctx.Done():
		}
	}()
	freed, err := c.releaseLeftover(ctx, name)
	if freed {
		c.log.Info("freed a shed shard's Lease its election left naming this pod", "shard", name)
	}
	return freed, err
}
