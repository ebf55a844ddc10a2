// Package worker is the app side of the handoff protocol, for Go workers.
//
// An Agent serves the endpoints the handoff sidecar calls (mount Handler on a
// loopback listener, or call ListenAndServe) and gives the worker what it
// needs to hand over cleanly:
//
//   - Receive before waiting for a message, Receive.Hold for each message
//     it got, Receive.End when the wait is over, and Claim.Done when a held
//     message is finished or handed back. A wait is not work: the sidecar
//     sees the worker drained once it holds no claim and waits for nothing,
//     and stop-claiming ends every wait at once (Receive.Context), so a
//     long poll neither delays the drain nor claims a message afterwards.
//   - Stopping, closed when the worker must stop claiming; Receive refuses
//     from then on, so claimed work only shrinks.
//   - Receive.HoldUnstarted and Claim.Start for messages received before
//     they are worked on (a batch, a prefetch): at stop-claiming those not
//     started are handed back at once through Options.HandBack, and Start
//     refuses them (ErrHandedBack); only started work drains.
//   - ReturnClaims, called at the drain deadline to hand back what is left,
//     and again after each claim that ends after it (one that waited for
//     its message past the deadline, then gave it up). WaitDrained waits
//     for those calls too, so a worker may exit once it returns.
//   - Leader and BeginLeading for leader-only work, with the fencing token to
//     pass to the systems the leader writes to. Leadership ends on the
//     worker's own clock even if the sidecar is gone.
//
// A claim loop:
//
//	for {
//		r, err := agent.Receive(ctx) // worker.ErrStopping once claiming has stopped
//		if err != nil {
//			return
//		}
//		msg, err := queue.Receive(r.Context()) // a long poll, cut off at stop-claiming without claiming
//		if err != nil || msg == nil {
//			r.End()
//			continue
//		}
//		c := r.Hold() // held from here: counted in flight, even after stop-claiming
//		r.End()
//		handle(c.Context(), msg)
//		c.Done()
//	}
//
// A batch, each message started in turn:
//
//	msgs := queue.ReceiveBatch(r.Context(), n)
//	claims := make([]*worker.Claim, len(msgs))
//	for i, m := range msgs {
//		claims[i] = r.HoldUnstarted(m) // in flight, unstarted
//	}
//	r.End()
//	for i, c := range claims {
//		if c.Start() != nil { // worker.ErrHandedBack: HandBack has it
//			continue
//		}
//		handle(c.Context(), msgs[i])
//		c.Done()
//	}
package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/handoff-dev/handoff/protocol"
)

// ErrStopping is returned by Receive and Begin once the worker must stop
// claiming, and is the cause (context.Cause) of a Receive context ended by
// stop-claiming.
var ErrStopping = errors.New("handoff: claiming has stopped")

// ErrCanceled is the cause (context.Cause) of a Claim context canceled by
// the sidecar's "cancel" fallback at the drain deadline.
var ErrCanceled = errors.New("handoff: in-flight work canceled at the drain deadline")

// ErrHandedBack is returned by Claim.Start for a claim held unstarted
// (Receive.HoldUnstarted) that stop-claiming took to hand back
// (Options.HandBack): the message is the queue's again, maybe another
// worker's already; drop it.
var ErrHandedBack = errors.New("handoff: unstarted claim handed back at stop-claiming")

// ErrClaimDone is returned by Claim.Start after Claim.Done.
var ErrClaimDone = errors.New("handoff: claim is done")

// ErrReturnOverdue is returned (wrapped) by WaitDrained when nothing is
// held but a call of Options.ReturnClaims made after the return fallback
// began has not returned by the end of its ctx (its bound): 10 s for the
// Agent's own calls, the return call's own for Return's. The worker may
// exit; what that call has not handed back waits for its visibility
// timeout.
var ErrReturnOverdue = errors.New("handoff: a hand-back after the return fallback did not return within its bound")

// handBackTimeout bounds one call of Options.HandBack. Claims it did not
// hand back in time (or with an error) are left to the drain deadline's
// fallback (Options.ReturnClaims), then ended.
const handBackTimeout = 10 * time.Second

// ErrNotLeader is returned by BeginLeading when this worker does not lead
// the Lease.
var ErrNotLeader = errors.New("handoff: not the leader of this Lease")

// Options configures an Agent.
type Options struct {
	// ReturnClaims hands back every claim the worker holds and has not
	// finished (for a queue with a visibility timeout: make them visible
	// now), and says how many it handed back. It is called at the drain
	// deadline (Return), after in-flight work was canceled when the
	// sidecar's fallback is "cancel", and again after each claim the app
	// ends (Claim.Done) from then on, whether it was held at the deadline
	// or after it: a wait inside Begin, or a queue call on the ctx given to
	// Receive, may claim a message after the first call, and the worker
	// may give it up without finishing it. Those later calls run in a
	// goroutine of the Agent's, under a 10 s bound (ctx); claims ending
	// while one runs are covered by one more call after it. Calls never
	// overlap, and WaitDrained waits for them (each up to the end of its
	// ctx). It must be safe to call more than once. Nil: nothing is
	// handed back and the claims wait for their visibility timeout.
	ReturnClaims func(ctx context.Context) (returned int, err error)
	// HandBack hands back claims held unstarted (Receive.HoldUnstarted):
	// the rest of a batch, prefetched or buffered messages (for a queue
	// with a visibility timeout: make them visible now, if still this
	// worker's; for RabbitMQ: nack with requeue; for JetStream: Nak). The
	// Agent calls it at stop-claiming, in a goroutine of its own, with
	// every claim then unstarted (Claim.Value tells which messages), and
	// again for each claim held unstarted after stop-claiming; one call at
	// a time, under a 10 s bound (ctx). It returns nil once every one is
	// handed back; the Agent then ends the claims (Claim.Done is not the
	// app's to call). On an error they stay held, counted unstarted, until
	// the drain deadline's Return, which ends them after ReturnClaims (or,
	// failed after Return, after ReturnClaims runs again). Claims started
	// before (Claim.Start, Hold, Begin) are not passed: they drain. Nil:
	// unstarted claims are not handed back at stop-claiming; they stay
	// held until started or done, like the others.
	HandBack func(ctx context.Context, unstarted []*Claim) error
	// Logger receives the Agent's logs; the zero value discards them.
	Logger logr.Logger
	// Clock times leadership terms: the end of a term (Leadership.Until),
	// the timer that ends its context, and the receipt time a grant's
	// validForMillis counts from. Nil: clock.RealClock{}. Tests pass a
	// k8s.io/utils/clock/testing.FakeClock.
	Clock clock.WithDelayedExecution

	// Token is the pod's token (docs/protocol.md, "The pod's token"): every
	// call to Handler must be signed with it (protocol.Sign: a signature,
	// a timestamp within 30 s and a nonce not seen before), or it is
	// answered 401 and not acted on. Empty: read from the file TokenFile.
	Token string
	// TokenFile is the file the token is read from, once, by New (it does
	// not change while the pod lives). Empty: the file named by the
	// environment variable HANDOFF_TOKEN_FILE (protocol.TokenFileEnv),
	// which the injector sets in the worker container.
	TokenFile string
	// InsecureNoToken lets New return an Agent that answers calls without a
	// token when none is configured (Token, TokenFile and
	// HANDOFF_TOKEN_FILE all empty): any process that reaches its address
	// can then stop its claiming and grant or revoke its leadership, and a
	// call may be replayed. For
	// local development and tests without a sidecar only; a configured
	// token is required even with this set.
	InsecureNoToken bool
	// LeaseDuration bounds the leadership grants the Agent accepts: a
	// grant valid for longer (validForMillis, or until beyond receipt plus
	// LeaseDuration) cannot come from a sidecar whose lease duration this
	// is (its terms are shorter), and is answered 422. Zero: the duration
	// in the environment variable HANDOFF_LEASE_DURATION
	// (protocol.LeaseDurationEnv; the injector sets it in the worker
	// container), else protocol.MaxLeaseDuration (1h).
	LeaseDuration time.Duration
}

// Agent is the worker's end of the handoff protocol. Its methods are safe
// for concurrent use.
type Agent struct {
	instance string // DrainStatus.Instance: this process's, random
	opts     Options
	verifier *protocol.Verifier // of the pod's token; nil only with InsecureNoToken
	maxTerm  time.Duration      // the longest grant accepted
	log      logr.Logger
	clock    clock.WithDelayedExecution

	mu       sync.Mutex
	stopping chan struct{} // closed by StopClaiming
	held     int           // claims held: Hold, HoldUnstarted (or Begin) and not Done
	// unstarted counts the claims among held not started: HoldUnstarted
	// and not Start, handed back, or Done.
	unstarted int
	// toHandBack are the claims taken for HandBack and not yet passed to
	// it; handingBack says handBackLoop runs; failed are the claims
	// HandBack did not hand back, for Return to end.
	toHandBack  []*Claim
	handingBack bool
	failed      []*Claim
	// returned says Return has called (or is calling) ReturnClaims: from
	// then on each claim the app ends asks for one more call
	// (returnAgain), which returnAgainLoop makes while returningAgain.
	returned       bool
	returnAgain    bool
	returningAgain bool
	// returning counts the Return calls under way, and callCtx is the ctx
	// of the ReturnClaims call under way (nil when none): WaitDrained
	// waits for both, up to the end of callCtx.
	returning int
	callCtx   context.Context
	// returnTurn is held (a value sent) by whoever calls ReturnClaims, so
	// that calls never overlap; apart from mu, which no call runs under.
	returnTurn chan struct{}
	// receives are the receives begun and not ended; StopClaiming cancels
	// their contexts.
	receives map[*Receive]struct{}
	// claims are the claims held, for StopClaiming to find the unstarted.
	claims  map[*Claim]struct{}
	changed chan struct{} // closed and replaced whenever held or receives change
	// work is the parent of every Claim context; canceled by the "cancel"
	// fallback.
	work       context.Context
	cancelWork context.CancelCauseFunc
	leases     map[string]*term
	sequences  map[string]int64 // the last Leadership.Sequence applied, by Lease

	// lmu guards lchanged, closed and replaced at each change of the terms
	// (LeadershipChanged); apart from mu, as a term's timer closes it.
	lmu      sync.Mutex
	lchanged chan struct{}
}

// New returns an Agent that has not been asked to stop. It reads the pod's
// token (Options.Token, else the file Options.TokenFile, else the file
// named by HANDOFF_TOKEN_FILE) and the bound of a leadership term
// (Options.LeaseDuration, else HANDOFF_LEASE_DURATION, else 1h). It
// returns an error naming the option and the variable when no token is
// configured and Options.InsecureNoToken is not set, when the token file
// cannot be read or holds no token (protocol.ReadTokenFile), and when
// HANDOFF_LEASE_DURATION is not a duration from 1ms to 1h.
func New(opts Options) (*Agent, error) {
	token, err := agentToken(opts)
	if err != nil {
		return nil, err
	}
	maxTerm, err := agentMaxTerm(opts)
	if err != nil {
		return nil, err
	}
	work, cancel := context.WithCancelCause(context.Background())
	clk := opts.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	var id [8]byte
	_, _ = rand.Read(id[:]) // crypto/rand.Read never fails
	var verifier *protocol.Verifier
	if token != "" {
		// The node's wall clock, which the sidecar signs with, whatever
		// Options.Clock times the terms with.
		verifier = protocol.NewVerifier(token, time.Now)
	}
	return &Agent{
		instance:   hex.EncodeToString(id[:]),
		opts:       opts,
		verifier:   verifier,
		maxTerm:    maxTerm,
		log:        opts.Logger,
		clock:      clk,
		stopping:   make(chan struct{}),
		receives:   map[*Receive]struct{}{},
		claims:     map[*Claim]struct{}{},
		changed:    make(chan struct{}),
		returnTurn: make(chan struct{}, 1),
		work:       work,
		cancelWork: cancel,
		leases:     map[string]*term{},
		sequences:  map[string]int64{},
		lchanged:   make(chan struct{}),
	}, nil
}

// agentToken is the token New configures: Options.Token, else the file
// Options.TokenFile, else the file named by HANDOFF_TOKEN_FILE; "" only
// with Options.InsecureNoToken.
func agentToken(opts Options) (string, error) {
	if opts.Token != "" {
		if err := protocol.CheckToken(opts.Token); err != nil {
			return "", fmt.Errorf("worker: Options.Token: %w", err)
		}
		return opts.Token, nil
	}
	file := opts.TokenFile
	if file == "" {
		file = os.Getenv(protocol.TokenFileEnv)
	}
	if file != "" {
		tok, err := protocol.ReadTokenFile(file)
		if err != nil {
			return "", fmt.Errorf("worker: the pod's token (Options.TokenFile or %s): %w", protocol.TokenFileEnv, err)
		}
		return tok, nil
	}
	if opts.InsecureNoToken {
		return "", nil
	}
	return "", fmt.Errorf("worker: no token configured: set the environment variable %s to the pod's token file (the handoff injector sets it to %s), or Options.TokenFile or Options.Token; Options.InsecureNoToken serves without one, for local development only",
		protocol.TokenFileEnv, protocol.TokenFile)
}

// agentMaxTerm is the longest grant New accepts.
func agentMaxTerm(opts Options) (time.Duration, error) {
	if opts.LeaseDuration < 0 {
		return 0, fmt.Errorf("worker: Options.LeaseDuration %s: want a duration above 0, or 0 for %s", opts.LeaseDuration, protocol.LeaseDurationEnv)
	}
	if opts.LeaseDuration > 0 {
		return opts.LeaseDuration, nil
	}
	v, ok := os.LookupEnv(protocol.LeaseDurationEnv)
	if !ok || v == "" {
		return protocol.MaxLeaseDuration, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > protocol.MaxLeaseDuration {
		return 0, fmt.Errorf("worker: environment variable %s %q: want the sidecar's lease duration, a duration above 0 and at most %s, like 15s", protocol.LeaseDurationEnv, v, protocol.MaxLeaseDuration)
	}
	return d, nil
}

// Stopping returns a channel that is closed when the worker must stop
// claiming new work.
func (a *Agent) Stopping() <-chan struct{} { return a.stopping }

// InFlight is the number of claims held: made by Receive.Hold,
// Receive.HoldUnstarted (or Begin) and not yet Done, started or not.
// Pending receives are not counted.
func (a *Agent) InFlight() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held
}

// Unstarted is the number of claims among InFlight held unstarted
// (Receive.HoldUnstarted) and not yet started, or handed back and ended.
func (a *Agent) Unstarted() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.unstarted
}

// StopClaiming closes Stopping and ends the context of every pending
// receive, with cause ErrStopping, before it returns; Receive and Begin
// refuse from then on. Claims started go on. Claims held unstarted are
// taken (Claim.Start refuses them with ErrHandedBack) and handed back at
// once through Options.HandBack, in a goroutine, so StopClaiming does not
// wait for the queue. Idempotent.
func (a *Agent) StopClaiming() { a.stopClaiming() }

// stopClaiming is StopClaiming, and returns the drain status at the moment
// claiming stopped: the first call's, before the unstarted claims are taken
// to hand back, so its in-flight and unstarted counts are what the app held
// when told to stop (the answer to stop-claiming); a later call's, now.
func (a *Agent) stopClaiming() protocol.DrainStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-a.stopping:
		return a.drainStatusLocked()
	default:
	}
	close(a.stopping)
	for r := range a.receives {
		r.cancel(ErrStopping)
	}
	a.log.Info("stop claiming", "inFlight", a.held, "unstarted", a.unstarted, "receiving", len(a.receives))
	st := a.drainStatusLocked()
	var unstarted []*Claim
	for c := range a.claims {
		if c.state == claimUnstarted {
			unstarted = append(unstarted, c)
		}
	}
	a.takeLocked(unstarted)
	return st
}

// takeLocked takes claims, unstarted, to hand back through
// Options.HandBack, and starts handBackLoop if it does not run; a.mu must
// be held. Without HandBack it does nothing.
func (a *Agent) takeLocked(claims []*Claim) {
	if a.opts.HandBack == nil || len(claims) == 0 {
		return
	}
	for _, c := range claims {
		c.state, c.taken = claimHandedBack, true
	}
	a.toHandBack = append(a.toHandBack, claims...)
	if !a.handingBack {
		a.handingBack = true
		go a.handBackLoop()
	}
}

// handBackLoop passes the claims taken to Options.HandBack until none is
// left, and ends those it handed back.
func (a *Agent) handBackLoop() {
	for {
		a.mu.Lock()
		claims := a.toHandBack
		a.toHandBack = nil
		if len(claims) == 0 {
			a.handingBack = false
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), handBackTimeout)
		err := a.opts.HandBack(ctx, claims)
		cancel()
		if err != nil {
			a.log.Error(err, "hand back unstarted claims failed; left to the drain deadline's fallback", "claims", len(claims))
			a.mu.Lock()
			a.failed = append(a.failed, claims...)
			if a.returned { // the fallback has run: ReturnClaims again, then end them
				a.returnAgainLocked()
			}
			a.mu.Unlock()
			continue
		}
		a.log.Info("unstarted claims handed back", "count", len(claims))
		for _, c := range claims {
			c.end(true)
		}
	}
}

// WaitDrained waits until the worker is drained and every claim it ended
// since the return fallback began has been handed back, and returns nil: a
// worker may exit once it returns, and leaves nothing claimed. Drained is
// no claim held and no receive pending, as the sidecar sees it; from the
// return fallback on (Return) it also waits for Return to answer and for
// each call of Options.ReturnClaims asked for since (one after each claim
// ended, see there) to return. Before stop-claiming an idle worker usually
// has a receive pending, so it is not drained.
//
// It returns ctx's error if ctx ends first. It waits for a call of
// ReturnClaims under way only until that call's ctx ends (its bound: 10 s
// for the Agent's own calls, the return call's own for Return's, which
// ends when the sidecar gives up on the call): then, with nothing held, it
// returns an error wrapping ErrReturnOverdue, and what the call has not
// handed back waits for its visibility timeout.
func (a *Agent) WaitDrained(ctx context.Context) error {
	for {
		a.mu.Lock()
		drained, changed := a.held == 0 && len(a.receives) == 0, a.changed
		settled := a.returning == 0 && !a.returningAgain
		var bound <-chan struct{} // the end of the call under way's ctx, with nothing held
		callCtx := a.callCtx
		if drained && callCtx != nil {
			bound = callCtx.Done()
		}
		a.mu.Unlock()
		if drained && settled {
			return nil
		}
		select {
		case <-changed:
		case <-bound:
			a.mu.Lock()
			still := a.callCtx == callCtx
			a.mu.Unlock()
			if still {
				return fmt.Errorf("worker: wait drained: Options.ReturnClaims, called after the return fallback began, has not returned by the end of its ctx (%w): %w", context.Cause(callCtx), ErrReturnOverdue)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// waitClaims waits until the worker is drained as the sidecar sees it (no
// claim held and no receive pending), or ctx ends: the drain long poll and
// Return's wait after the cancel fallback, which must not wait for the
// hand-backs (WaitDrained does).
func (a *Agent) waitClaims(ctx context.Context) {
	for {
		a.mu.Lock()
		drained, changed := a.held == 0 && len(a.receives) == 0, a.changed
		a.mu.Unlock()
		if drained {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// Return hands back unfinished claims through Options.ReturnClaims. It
// first stops claiming (StopClaiming), should stop-claiming never have
// reached the app: nothing is claimed after the hand-back. With cancel it
// then cancels the context of every held claim (cause ErrCanceled) and
// waits up to cancelWait (and until ctx ends) for the worker to be
// drained, so that ReturnClaims still has time when the work ignores
// cancellation. ReturnClaims runs even if claims are still held, once
// any call of it under way has returned (should ctx end first, Return
// returns ctx's cause and the Agent makes one more call after that one).
// From then on each claim the app ends (Claim.Done), held now or later,
// makes the Agent call ReturnClaims again (see Options.ReturnClaims): a
// message claimed after this call and given up is handed back too. The
// count returned is this call's alone; the later calls' are logged.
// WaitDrained waits for Return, and for those later calls.
func (a *Agent) Return(ctx context.Context, cancel bool, cancelWait time.Duration) (int, error) {
	a.mu.Lock()
	a.returning++
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.returning--
		a.changedLocked()
		a.mu.Unlock()
	}()
	a.stopClaiming()
	if cancel {
		a.cancelWork(ErrCanceled)
		wctx, stop := context.WithTimeout(ctx, cancelWait)
		a.waitClaims(wctx) // not drained in time: hand back what is left
		stop()
	}
	if !a.takeReturnTurn(ctx) {
		// Another call runs (this Return is a repeat) and outlived ctx:
		// one more call after it stands in for this one.
		a.mu.Lock()
		a.returnAgainLocked()
		a.mu.Unlock()
		return 0, fmt.Errorf("worker: return: waiting for the hand-back under way: %w", context.Cause(ctx))
	}
	n, err := a.returnClaims(ctx)
	if a.opts.ReturnClaims != nil {
		a.log.Info("claims returned", "returned", n, "cancel", cancel, "error", err)
	}
	return n, err
}

// takeReturnTurn waits for the turn to call Options.ReturnClaims, and says
// whether it has it: false if ctx ended first (a turn free at once is
// taken even then).
func (a *Agent) takeReturnTurn(ctx context.Context) bool {
	select {
	case a.returnTurn <- struct{}{}:
		return true
	default:
	}
	select {
	case a.returnTurn <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// returnClaims calls Options.ReturnClaims (if set) with ctx, then ends the
// unstarted claims HandBack failed on: the call handed them back, or they
// are left to their visibility timeout; either way no longer held. The
// caller holds returnTurn, which returnClaims gives back. Claims the app
// ends from the moment it marks the fallback run ask for one more call
// (a claim ended during this one may be one it did not see).
func (a *Agent) returnClaims(ctx context.Context) (int, error) {
	a.mu.Lock()
	a.returned, a.returnAgain = true, false // this call covers what ended before
	failed := a.failed
	a.failed = nil
	a.callCtx = ctx
	a.changedLocked()
	a.mu.Unlock()
	n, err := 0, error(nil)
	if a.opts.ReturnClaims != nil {
		n, err = a.opts.ReturnClaims(ctx)
	}
	a.mu.Lock()
	a.callCtx = nil
	a.changedLocked()
	a.mu.Unlock()
	<-a.returnTurn
	for _, c := range failed {
		c.end(true)
	}
	return n, err
}

// returnAgainLocked asks for one more call of Options.ReturnClaims, after
// the one under way if any, and starts returnAgainLoop if it does not
// run; a.mu must be held.
func (a *Agent) returnAgainLocked() {
	a.returnAgain = true
	if !a.returningAgain {
		a.returningAgain = true
		go a.returnAgainLoop()
	}
}

// returnAgainLoop calls Options.ReturnClaims while calls are asked for
// (returnAgainLocked), one at a time: the requests made while it waits for
// its turn or while a call runs are all covered by the next call.
func (a *Agent) returnAgainLoop() {
	// returnAgainTimeout bounds one call: the pod is past its drain
	// deadline, and a stuck queue must not keep later claims from being
	// handed back.
	const returnAgainTimeout = 10 * time.Second
	for {
		a.returnTurn <- struct{}{}
		a.mu.Lock()
		if !a.returnAgain {
			a.returningAgain = false
			a.changedLocked()
			a.mu.Unlock()
			<-a.returnTurn
			return
		}
		a.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), returnAgainTimeout)
		n, err := a.returnClaims(ctx)
		cancel()
		if a.opts.ReturnClaims == nil {
			continue
		}
		if err != nil {
			a.log.Error(err, "returning claims again after the drain deadline failed; what is still claimed is left to its visibility timeout", "returned", n)
		} else {
			a.log.Info("claims returned again after the drain deadline", "returned", n)
		}
	}
}

// drainStatus is the protocol's view of the claims.
func (a *Agent) drainStatus() protocol.DrainStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.drainStatusLocked()
}

// drainStatusLocked is drainStatus; a.mu must be held.
func (a *Agent) drainStatusLocked() protocol.DrainStatus {
	stopping := false
	select {
	case <-a.stopping:
		stopping = true
	default:
	}
	var oldest time.Time
	for c := range a.claims {
		if c.state == claimStarted && (oldest.IsZero() || c.started.Before(oldest)) {
			oldest = c.started
		}
	}
	running := int64(0)
	if !oldest.IsZero() {
		running = max(a.clock.Since(oldest).Milliseconds(), 0)
	}
	return protocol.DrainStatus{Stopping: stopping, InFlight: a.held, Unstarted: a.unstarted, Receiving: len(a.receives),
		RunningMillis: running, Drained: a.held == 0 && len(a.receives) == 0, Instance: a.instance}
}

// changedLocked wakes WaitDrained; a.mu must be held.
func (a *Agent) changedLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}
