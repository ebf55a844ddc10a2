package worker

import (
	"context"
	"sync"
)

// Receive is one wait for messages, begun by Agent.Receive and ended by End.
// While it is pending the worker is not drained, but nothing is in flight:
// the wait holds no claim. Stop-claiming ends its Context, so a pending
// receive ends quickly, and the drain waits only for that.
//
// Its methods are safe for concurrent use, so a consumer whose messages
// arrive on callbacks may keep one Receive pending and Hold each delivery.
type Receive struct {
	a      *Agent
	parent context.Context // the parent of the claims held
	ctx    context.Context
	cancel context.CancelCauseFunc
	ended  bool // guarded by a.mu
}

// Receive begins a wait for messages. Wait with the returned Receive's
// Context (a long poll, a subscription, the pause between polls of a
// table), call Hold for each message received, then End. Receive returns
// ErrStopping once the worker must stop claiming, and ctx's error if ctx
// has ended.
func (a *Agent) Receive(ctx context.Context) (*Receive, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.stopping:
		return nil, ErrStopping
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r := &Receive{a: a, parent: ctx}
	r.ctx, r.cancel = context.WithCancelCause(ctx)
	a.receives[r] = struct{}{}
	a.changedLocked()
	return r, nil
}

// Context is the context to wait for messages with. It ends with the ctx
// given to Receive, at stop-claiming (context.Cause is then ErrStopping),
// and at End.
//
// Ending a wait must not lose a message: if your queue client cannot tell
// whether a canceled call took one (it may have committed a claim that the
// cancellation cut off), run that call with the ctx given to Receive and
// wait only between calls with Context. The receive is pending while the
// call runs, so a message it gets in the race with stop-claiming is held,
// and so finished or handed back.
func (r *Receive) Context() context.Context { return r.ctx }

// Hold marks one received message as held and returns its Claim: from now
// until Claim.Done it is in flight, and the drain waits for it or the
// fallback hands it back (Options.ReturnClaims). Call it for every message
// received, before End, even after stop-claiming (a message received in
// the race with it): Hold never refuses. A Hold after End is still counted,
// but the sidecar may have seen the worker drained in between.
func (r *Receive) Hold() *Claim {
	a := r.a
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.holdLocked(r.parent)
}

// End ends the wait: call it once the messages received are held, or when
// none came. It cancels Context. Calls after the first do nothing.
func (r *Receive) End() {
	a := r.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.ended {
		return
	}
	r.ended = true
	r.cancel(context.Canceled)
	delete(a.receives, r)
	a.changedLocked()
}

// Claim is one message the worker holds, from Receive.Hold (or Begin) until
// Done.
type Claim struct {
	a      *Agent
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   func() bool // stops the cancel fallback's AfterFunc
	once   sync.Once
}

// holdLocked counts one more claim; a.mu must be held.
func (a *Agent) holdLocked(parent context.Context) *Claim {
	c := &Claim{a: a}
	c.ctx, c.cancel = context.WithCancelCause(parent)
	c.stop = context.AfterFunc(a.work, func() { c.cancel(context.Cause(a.work)) })
	a.held++
	a.changedLocked()
	return c
}

// Context is the context to work on the claim with. It ends with the ctx
// given to Receive (or Begin), when the sidecar's "cancel" fallback cancels
// in-flight work at the drain deadline (context.Cause is then ErrCanceled),
// and at Done. Stop-claiming does not end it.
func (c *Claim) Context() context.Context { return c.ctx }

// Done says the claim is over: finished, or handed back to the queue. Call
// it once the queue knows, not before; calls after the first do nothing.
func (c *Claim) Done() {
	c.once.Do(func() {
		c.stop()
		c.cancel(context.Canceled)
		a := c.a
		a.mu.Lock()
		a.held--
		a.changedLocked()
		a.mu.Unlock()
	})
}

// Begin holds one claim at once, for work that is claimed the moment it
// begins (no wait for a message), and returns its context and its done
// (Claim.Context and Claim.Done). A wait for a message inside Begin counts
// as in flight and is not ended by stop-claiming: use Receive for that.
// Begin returns ErrStopping once the worker must stop claiming.
func (a *Agent) Begin(ctx context.Context) (context.Context, func(), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.stopping:
		return nil, nil, ErrStopping
	default:
	}
	c := a.holdLocked(ctx)
	return c.ctx, c.Done, nil
}
