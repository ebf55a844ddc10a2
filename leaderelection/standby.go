package leaderelection

import (
	"bytes"
	"context"
	"encoding/json"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
)

// wakePeriod is the retry period of a standby's client-go elector. The
// elector's Gets wait on the watch, so a short period costs no requests: it
// only bounds how soon after a change the elector reads again. That matters
// when the Lease is released just after a renewal: the elector, handed the
// renewal, sleeps one to 2.2 periods (client-go's jitter) before its next
// Get, and sees the release only then. At 10 ms that was up to 22 ms for a
// release in the 10-22 ms after a renewal (about one in 120 with a renewal
// every 2 s; bench/takeover's "watch sees it -> standby's elector handed it"
// hop); at 1 ms it is at most 2.2 ms. The elector still wakes once per
// change of the Lease, and never sends a request for it.
const wakePeriod = time.Millisecond

// watchedLeases is the Leases client of a standby's LeaseLock. Its Get
// waits until the watched Lease changes, is free (no holder, or missing), or
// its lease duration has run out since the elector was last shown a change,
// and then answers from the watch: so client-go's elector, and only it,
// decides to acquire, the moment the Lease can be taken; a free Lease whose
// release named another candidate as successor is answered only once that
// candidate has taken it or SuccessorGrace has run out. Writes go to the
// API. Until the watch has listed, and after a failed write until the watch
// shows an event, Get reads the API once per retry period (jittered as
// client-go's polling is), so a broken or stale watch degrades to polling;
// a wait for the next poll ends as soon as the watch has listed or shown
// that event, and Get answers from the watch. The first poll is due one
// retry period after the first Get, not at once: a watch lists well within
// that, so a candidate's start sends no read, only the watch (a fleet of
// sidecars starting together would otherwise send a read per Lease on top
// of its watches, in the same second).
//
// One watchedLeases serves one elector; its methods are called from that
// elector's goroutine only.
type watchedLeases struct {
	coordinationv1client.LeasesGetter
	watch       *leaseWatch
	retryPeriod time.Duration
	// writeTimeout bounds each write: client-go gives a standby's writes
	// no deadline of their own.
	writeTimeout time.Duration
	clock        clock.Clock
	trace        func(Hop) // Config.Trace
	identity     string    // this candidate's holder identity

	answered bool      // a Get has been answered
	last     []byte    // the record in the last answer
	expires  time.Time // when last runs out, counted from when it was first answered
	poll     bool      // answer from the API...
	pollFrom uint64    // ...until the watch has seen more events than this
	nextPoll time.Time
	// yieldTo is the resourceVersion of the last release seen naming
	// another candidate as successor, and yieldUntil when this standby
	// stops holding back for it (SuccessorGrace after it was first seen).
	yieldTo    string
	yieldUntil time.Time
}

func (c *watchedLeases) Leases(namespace string) coordinationv1client.LeaseInterface {
	return &watchedLeaseClient{LeaseInterface: c.LeasesGetter.Leases(namespace), c: c}
}

type watchedLeaseClient struct {
	coordinationv1client.LeaseInterface
	c *watchedLeases
}

func (l *watchedLeaseClient) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	return l.c.get(ctx, l.LeaseInterface, name, opts)
}

// Create and Update send an acquiring write. It is not cut when the
// standby's context ends, only at its own timeout: a write already sent may
// land, and an elector that abandoned its answer would not know the Lease
// names it, so would neither lead nor release it (it would name a
// candidate that no longer runs until it expired). Answered, the elector
// leads, sees its context ended and releases at once (Elector.Run).
func (l *watchedLeaseClient) Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.c.writeTimeout)
	defer cancel()
	out, err := l.LeaseInterface.Create(ctx, lease, opts)
	l.c.wrote(err)
	return out, err
}

func (l *watchedLeaseClient) Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.c.writeTimeout)
	defer cancel()
	out, err := l.LeaseInterface.Update(ctx, lease, opts)
	l.c.wrote(err)
	return out, err
}

func (c *watchedLeases) get(ctx context.Context, api coordinationv1client.LeaseInterface, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	if c.nextPoll.IsZero() {
		c.nextPoll = c.clock.Now().Add(wait.Jitter(c.retryPeriod, leaderelection.JitterFactor))
	}
	for {
		lease, synced, events, next := c.watch.current()
		if c.poll && events > c.pollFrom {
			c.poll = false
		}
		if !synced || c.poll {
			wait := c.nextPoll.Sub(c.clock.Now())
			if wait <= 0 {
				return c.pollAPI(ctx, api, name, opts)
			}
			// Until the next poll is due, the watch may take over: its
			// first list completing, or (after a failed write) its next
			// event, ends the wait, so a standby started just before a
			// release does not sleep through it.
			var listed <-chan struct{}
			if !synced {
				listed = c.watch.synced()
			}
			if err := c.sleep(ctx, wait, next, listed); err != nil {
				return nil, err
			}
			continue
		}
		raw := recordOf(lease)
		now := c.clock.Now()
		free := lease == nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == ""
		if wait := c.yield(lease, now); wait > 0 {
			// A release naming another successor: let it take the Lease
			// first; its acquisition (or the grace running out) wakes us.
			if err := c.sleep(ctx, wait, next, nil); err != nil {
				return nil, err
			}
			continue
		}
		if !c.answered || free || !bytes.Equal(raw, c.last) || !now.Before(c.expires) {
			c.answer(lease, raw, now)
			if free && c.trace != nil {
				c.trace(HopFreeAnswered)
			}
			if lease == nil {
				return nil, apierrors.NewNotFound(coordinationv1.Resource("leases"), name)
			}
			return lease.DeepCopy(), nil
		}
		if err := c.sleep(ctx, c.expires.Sub(now), next, nil); err != nil {
			return nil, err
		}
	}
}

// yield returns how long this standby still holds back from a free Lease
// whose release named another candidate as successor (AnnotationSuccessor):
// SuccessorGrace from when it first saw that release, on its own clock; 0
// when the Lease is held, names no successor or names this candidate, or
// the grace has run out.
func (c *watchedLeases) yield(lease *coordinationv1.Lease, now time.Time) time.Duration {
	s := successorOf(lease)
	if s == "" || s == c.identity {
		return 0
	}
	if lease.ResourceVersion != c.yieldTo || c.yieldUntil.IsZero() {
		c.yieldTo, c.yieldUntil = lease.ResourceVersion, now.Add(SuccessorGrace)
	}
	return c.yieldUntil.Sub(now)
}

// sleep waits for d on the clock, or until next or listed is closed; it
// returns ctx's error if ctx ends first.
func (c *watchedLeases) sleep(ctx context.Context, d time.Duration, next, listed <-chan struct{}) error {
	timer := c.clock.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-next:
	case <-listed:
	case <-timer.C():
	}
	return nil
}

// pollAPI reads the Lease from the API and sets when the next poll is due.
func (c *watchedLeases) pollAPI(ctx context.Context, api coordinationv1client.LeaseInterface, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	c.nextPoll = c.clock.Now().Add(wait.Jitter(c.retryPeriod, leaderelection.JitterFactor))
	lease, err := api.Get(ctx, name, opts)
	if err == nil {
		c.answer(lease, recordOf(lease), c.clock.Now())
	}
	return lease, err
}

// answer notes the record handed to the elector; like the elector, it
// restarts the expiry clock only when the record differs from the last.
func (c *watchedLeases) answer(lease *coordinationv1.Lease, raw []byte, now time.Time) {
	c.answered = true
	if bytes.Equal(raw, c.last) {
		return
	}
	c.last = raw
	c.expires = now
	if lease != nil && lease.Spec.LeaseDurationSeconds != nil {
		c.expires = now.Add(time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second)
	}
}

// wrote switches to polling after a failed write: the watch may be behind
// the API, and its next event shows it caught up.
func (c *watchedLeases) wrote(err error) {
	if err == nil {
		return
	}
	_, _, events, _ := c.watch.current()
	c.poll, c.pollFrom = true, events
	c.nextPoll = c.clock.Now().Add(wait.Jitter(c.retryPeriod, leaderelection.JitterFactor))
}

// recordOf is the Lease's election record as client-go's LeaseLock encodes
// it for comparison (times at one-second resolution); nil for no Lease.
func recordOf(lease *coordinationv1.Lease) []byte {
	if lease == nil {
		return nil
	}
	raw, err := json.Marshal(rl.LeaseSpecToLeaderElectionRecord(&lease.Spec))
	if err != nil { // a struct of strings, ints and times
		panic(err)
	}
	return raw
}
