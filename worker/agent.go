// Package worker is the app side of the handoff protocol, for Go workers.
//
// An Agent serves the endpoints the handoff sidecar calls (mount Handler on a
// loopback listener, or call ListenAndServe) and gives the worker what it
// needs to hand over cleanly:
//
//   - Begin before each claim, and the func it returns when the claim is
//     finished or handed back: the sidecar learns when the worker is
//     drained, and after stop-claiming Begin refuses, so claimed work only
//     shrinks.
//   - Stopping, closed when the worker must stop claiming.
//   - ReturnClaims, called at the drain deadline to hand back what is left.
//   - Leader and BeginLeading for leader-only work, with the fencing token to
//     pass to the systems the leader writes to. Leadership ends on the
//     worker's own clock even if the sidecar is gone.
package worker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// ErrStopping is returned by Begin once the worker must stop claiming.
var ErrStopping = errors.New("handoff: claiming has stopped")

// ErrNotLeader is returned by BeginLeading when this worker does not lead
// the Lease.
var ErrNotLeader = errors.New("handoff: not the leader of this Lease")

// Options configures an Agent.
type Options struct {
	// ReturnClaims hands back every claim the worker holds and has not
	// finished (for a queue with a visibility timeout: make them visible
	// now), and says how many it handed back. It is called at the drain
	// deadline, after in-flight work was canceled when the sidecar's fallback
	// is "cancel". It must be safe to call more than once. Nil: nothing is
	// handed back and the claims wait for their visibility timeout.
	ReturnClaims func(ctx context.Context) (returned int, err error)
	// Logger receives the Agent's logs; the zero value discards them.
	Logger logr.Logger
}

// Agent is the worker's end of the handoff protocol. Its methods are safe
// for concurrent use.
type Agent struct {
	opts Options
	log  logr.Logger

	mu       sync.Mutex
	stopping chan struct{} // closed by StopClaiming
	inFlight int
	changed  chan struct{} // closed and replaced whenever inFlight changes
	// work is the parent of every Begin context; canceled by the "cancel"
	// fallback.
	work       context.Context
	cancelWork context.CancelFunc
	leases     map[string]*term
	sequences  map[string]int64 // the last Leadership.Sequence applied, by Lease
}

// New returns an Agent that has not been asked to stop.
func New(opts Options) *Agent {
	work, cancel := context.WithCancel(context.Background())
	return &Agent{
		opts:       opts,
		log:        opts.Logger,
		stopping:   make(chan struct{}),
		changed:    make(chan struct{}),
		work:       work,
		cancelWork: cancel,
		leases:     map[string]*term{},
		sequences:  map[string]int64{},
	}
}

// Stopping returns a channel that is closed when the worker must stop
// claiming new work.
func (a *Agent) Stopping() <-chan struct{} { return a.stopping }

// Begin reserves a place for one claim; call it before claiming, and call
// done exactly once when that claim is finished, handed back, or was never
// made. The returned context ends with ctx, or when the sidecar's "cancel"
// fallback cancels in-flight work. Begin returns ErrStopping once the
// worker must stop claiming.
func (a *Agent) Begin(ctx context.Context) (context.Context, func(), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.stopping:
		return nil, nil, ErrStopping
	default:
	}
	a.setInFlight(a.inFlight + 1)
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(a.work, cancel)
	var once sync.Once
	done := func() {
		once.Do(func() {
			stop()
			cancel()
			a.mu.Lock()
			a.setInFlight(a.inFlight - 1)
			a.mu.Unlock()
		})
	}
	return wctx, done, nil
}

// InFlight is the number of claims begun and not done.
func (a *Agent) InFlight() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inFlight
}

// StopClaiming closes Stopping; Begin refuses from then on. Idempotent.
func (a *Agent) StopClaiming() {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.stopping:
	default:
		close(a.stopping)
		a.log.Info("stop claiming", "inFlight", a.inFlight)
	}
}

// WaitDrained waits until no claim is in flight or ctx ends, and returns the
// number in flight then.
func (a *Agent) WaitDrained(ctx context.Context) int {
	for {
		a.mu.Lock()
		n, changed := a.inFlight, a.changed
		a.mu.Unlock()
		if n == 0 {
			return 0
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return n
		}
	}
}

// Return hands back unfinished claims through Options.ReturnClaims. With
// cancel it first cancels in-flight work and waits up to cancelWait (and
// until ctx ends) for those claims to be done, so that ReturnClaims still
// has time when the work ignores cancellation.
func (a *Agent) Return(ctx context.Context, cancel bool, cancelWait time.Duration) (int, error) {
	if cancel {
		a.cancelWork()
		wctx, stop := context.WithTimeout(ctx, cancelWait)
		a.WaitDrained(wctx)
		stop()
	}
	if a.opts.ReturnClaims == nil {
		return 0, nil
	}
	n, err := a.opts.ReturnClaims(ctx)
	a.log.Info("claims returned", "returned", n, "cancel", cancel, "error", err)
	return n, err
}

// setInFlight must be called with a.mu held.
func (a *Agent) setInFlight(n int) {
	a.inFlight = n
	close(a.changed)
	a.changed = make(chan struct{})
}

// Leadership is one term as leader of a Lease, as the sidecar told it.
type Leadership struct {
	Lease string
	// FencingToken grows with each new holder of the Lease; pass it to the
	// systems leader work writes to, so they refuse an older holder.
	FencingToken int64
	// Until is when this term ends on this process's clock unless renewed.
	Until time.Time
}

// term is the Agent's record of leadership of one Lease.
type term struct {
	lead   Leadership
	ctx    context.Context // ends when the term ends
	cancel context.CancelFunc
	timer  *time.Timer
	work   sync.WaitGroup // leader work begun with BeginLeading
}

// Leader returns the current term for lease, and false when this worker
// does not lead it or the term has run out on the local clock.
func (a *Agent) Leader(lease string) (Leadership, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.leases[lease]
	if t == nil || t.ctx.Err() != nil || !time.Now().Before(t.lead.Until) {
		return Leadership{}, false
	}
	return t.lead, true
}

// BeginLeading starts leader work for lease. The returned context ends with
// ctx, or when the term ends (revoked, lost, or run out on the local clock);
// call done when the work is over: the sidecar frees the Lease only after
// every such done. It returns ErrNotLeader when this worker does not lead.
func (a *Agent) BeginLeading(ctx context.Context, lease string) (context.Context, Leadership, func(), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.leases[lease]
	if t == nil || t.ctx.Err() != nil || !time.Now().Before(t.lead.Until) {
		return nil, Leadership{}, nil, ErrNotLeader
	}
	t.work.Add(1)
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(t.ctx, cancel)
	var once sync.Once
	return wctx, t.lead, func() { once.Do(func() { stop(); cancel(); t.work.Done() }) }, nil
}

// sequenced records seq as the latest message about lease, and reports
// false when a later one was already applied.
func (a *Agent) sequenced(lease string, seq int64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if last, ok := a.sequences[lease]; ok && seq <= last {
		return false
	}
	a.sequences[lease] = seq
	return true
}

// grant starts or extends a term. A new fencing token ends the old term.
func (a *Agent) grant(l Leadership) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.leases[l.Lease]
	if t != nil && (t.lead.FencingToken != l.FencingToken || t.ctx.Err() != nil) {
		t.cancel()
		t = nil
	}
	if t == nil {
		ctx, cancel := context.WithCancel(context.Background())
		t = &term{ctx: ctx, cancel: cancel}
		t.timer = time.AfterFunc(time.Until(l.Until), cancel)
		a.leases[l.Lease] = t
		a.log.Info("leading", "lease", l.Lease, "fencingToken", l.FencingToken, "until", l.Until)
	} else {
		t.timer.Reset(time.Until(l.Until))
	}
	t.lead = l
}

// revoke ends the term for lease and waits, until ctx ends, for its leader
// work to be done. It returns ctx's error if the work did not stop in time.
func (a *Agent) revoke(ctx context.Context, lease string) error {
	a.mu.Lock()
	t := a.leases[lease]
	a.mu.Unlock()
	if t == nil {
		return nil
	}
	t.cancel()
	t.timer.Stop()
	done := make(chan struct{})
	go func() { t.work.Wait(); close(done) }()
	select {
	case <-done:
		a.log.Info("leadership revoked", "lease", lease)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
