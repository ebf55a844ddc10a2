package worker

import (
	"context"
	"time"
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

// Hold marks one received message as held and started and returns its
// Claim: from now until Claim.Done it is in flight, and the drain waits for it or the
// fallback hands it back (Options.ReturnClaims). Call it for every message
// received, before End, even after stop-claiming (a message received in
// the race with it): Hold never refuses. A Hold after End is still counted,
// but the sidecar may have seen the worker drained in between.
func (r *Receive) Hold() *Claim {
	a := r.a
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.holdLocked(r.parent, claimStarted, nil)
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

// Claim is one message the worker holds, from Receive.Hold,
// Receive.HoldUnstarted (or Begin) until Done.
type Claim struct {
	a      *Agent
	value  any // HoldUnstarted's v
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   func() bool // stops the cancel fallback's AfterFunc
	state  claimState  // guarded by a.mu
	taken  bool        // taken at stop-claiming to hand back; guarded by a.mu
	// started is when the claim was started (Hold, Begin, Start), on the
	// Agent's clock, for DrainStatus.RunningMillis; guarded by a.mu.
	started time.Time
}

// claimState is where a claim is: unstarted, started, taken by the Agent
// to hand back, or done.
type claimState int

const (
	claimStarted    claimState = iota // Hold, Begin, or Start
	claimUnstarted                    // HoldUnstarted, not yet started
	claimHandedBack                   // taken at stop-claiming; the Agent hands it back and ends it
	claimDone                         // Done
)

// holdLocked counts one more claim in state st; a.mu must be held.
func (a *Agent) holdLocked(parent context.Context, st claimState, v any) *Claim {
	c := &Claim{a: a, value: v, state: st}
	if st == claimStarted {
		c.started = a.clock.Now()
	}
	c.ctx, c.cancel = context.WithCancelCause(parent)
	c.stop = context.AfterFunc(a.work, func() { c.cancel(context.Cause(a.work)) })
	a.held++
	a.claims[c] = struct{}{}
	if st == claimUnstarted {
		a.unstarted++
	}
	a.changedLocked()
	return c
}

// HoldUnstarted is Hold for a message the worker received but will start
// later: the rest of a batch, a prefetched or buffered message. v is the
// app's handle on the message (its id, its delivery tag), given back by
// Claim.Value. The claim is held (counted in flight, and unstarted) until
// Claim.Start starts it or Done ends it. At stop-claiming the Agent takes
// every unstarted claim and hands it back at once, not at the drain
// deadline, through Options.HandBack; Start then refuses with
// ErrHandedBack and the Agent, not the app, ends the claim. A message held
// unstarted after stop-claiming (received in the race with it) is handed
// back the same way. Without Options.HandBack, unstarted claims stay held
// until started or done, as Hold's do.
func (r *Receive) HoldUnstarted(v any) *Claim {
	a := r.a
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.holdLocked(r.parent, claimUnstarted, v)
	select {
	case <-a.stopping:
		a.takeLocked([]*Claim{c})
	default:
	}
	return c
}

// Value is the v given to HoldUnstarted (nil for a claim from Hold or
// Begin).
func (c *Claim) Value() any { return c.value }

// Start starts work on a claim held unstarted (HoldUnstarted): from now on
// stop-claiming leaves it to drain, as a claim from Hold. It returns nil,
// also for a claim already started (and one from Hold or Begin);
// ErrHandedBack if stop-claiming took the claim to hand it back (drop the
// message: the Agent ends the claim); ErrClaimDone after Done.
func (c *Claim) Start() error {
	a := c.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if c.taken {
		return ErrHandedBack
	}
	switch c.state {
	case claimUnstarted:
		c.state = claimStarted
		c.started = a.clock.Now()
		a.unstarted--
		a.changedLocked()
	case claimDone:
		return ErrClaimDone
	}
	return nil
}

// Context is the context to work on the claim with. It ends with the ctx
// given to Receive (or Begin), when the sidecar's "cancel" fallback cancels
// in-flight work at the drain deadline (context.Cause is then ErrCanceled),
// and at Done. Stop-claiming does not end it, even for a claim it takes to
// hand back.
func (c *Claim) Context() context.Context { return c.ctx }

// Done says the claim is over: finished, or handed back to the queue. Call
// it once the queue knows, not before; calls after the first do nothing,
// and so does a call on a claim stop-claiming took to hand back (the Agent
// ends it once Options.HandBack has handed it back).
func (c *Claim) Done() { c.end(false) }

// end ends the claim, once: for the app (Done), unless the Agent took it
// to hand back; for the Agent (byAgent), a claim it took. The claim is
// marked done first, in one critical section with the check, so that
// stop-claiming never takes a claim the app has ended.
func (c *Claim) end(byAgent bool) {
	a := c.a
	a.mu.Lock()
	prev := c.state
	if prev == claimDone || c.taken != byAgent {
		a.mu.Unlock()
		return
	}
	c.state = claimDone
	a.mu.Unlock()
	c.stop()
	c.cancel(context.Canceled)
	a.mu.Lock()
	if prev == claimUnstarted || prev == claimHandedBack {
		a.unstarted--
	}
	delete(a.claims, c)
	a.held--
	a.changedLocked()
	if a.returned && !byAgent && a.opts.ReturnClaims != nil {
		// Past the drain deadline's hand-back: the queue may still have
		// this message claimed (received after it, given up unfinished).
		a.returnAgainLocked()
	}
	a.mu.Unlock()
}

// Begin holds one claim at once, for work that is claimed the moment it
// begins (no wait for a message), and returns its context and its done
// (Claim.Context and Claim.Done). A wait for a message inside Begin counts
// as in flight and is not ended by stop-claiming: use Receive for that. A
// message such a wait claims after the drain deadline's hand-back (Return)
// and gives up is handed back once done is called (Options.ReturnClaims
// runs again). Begin returns ErrStopping once the worker must stop
// claiming, and so after Return.
func (a *Agent) Begin(ctx context.Context) (context.Context, func(), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.stopping:
		return nil, nil, ErrStopping
	default:
	}
	c := a.holdLocked(ctx, claimStarted, nil)
	return c.ctx, c.Done, nil
}
