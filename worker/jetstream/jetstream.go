// Package jetstream is the handoff adapter for NATS JetStream pull
// consumers (github.com/nats-io/nats.go/jetstream): a claim loop on a
// worker.Agent that maps the protocol's steps onto JetStream's own
// primitives.
//
//   - Claiming is Consumer.Fetch: each claim loop fetches up to
//     Config.Batch messages, waiting up to Config.MaxWait for them, and
//     holds every message as it arrives (Receive.HoldUnstarted), so each
//     message the server delivered to this worker is counted in flight, and
//     unstarted until its handler starts (Claim.Start).
//   - Stop-claiming stops fetching: the loops fetch no more. A fetch under
//     way is not cut off (a canceled fetch drops what the server already
//     sent, which would wait out AckWait); it ends within MaxWait, and what
//     it brings is handed back at once.
//   - Hand back now is Msg.Nak, which makes the message deliverable to
//     another consumer at once: at stop-claiming for every message held
//     unstarted (worker.Options.HandBack), and at the drain deadline for
//     every message still held (worker.Options.ReturnClaims), after the
//     handler was canceled when the sidecar's fallback is "cancel".
//   - Keep alive is Msg.InProgress, sent for every message held and not yet
//     settled, started or not, every Config.KeepAliveInterval (AckWait/3 by
//     default), so a message is never redelivered while this worker still
//     holds it, however long the handler (or the drain) runs past AckWait.
//   - A handler that returns nil is acknowledged with Msg.DoubleAck (the
//     server confirms it before the claim is done); one that returns an
//     error is Nak'd, so another worker may retry it at once.
//
// A worker:
//
//	w, err := jetstream.New(worker.Options{Logger: log}, nc, consumer, jetstream.Config{Batch: 4})
//	...
//	go func() { _ = w.Agent().ListenAndServe(ctx, "") }() // $HANDOFF_APP_URL; or mount w.Agent().Handler()
//	err = w.Run(ctx, func(ctx context.Context, msg js.Msg) error {
//		return apply(ctx, msg.Data()) // nil: acked; an error: Nak'd
//	})
//
// Delivery is at least once, as JetStream's: a message whose handler
// finished but whose ack did not reach the server (the process died, the
// connection broke) is delivered again after AckWait, and one handed back
// at the drain deadline by the "return" fallback while its handler still
// ran may be applied by another worker too. Apply messages idempotently
// (by Msg.Metadata's stream sequence, or a Nats-Msg-Id header).
package jetstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"

	"github.com/handoff-dev/handoff/worker"
)

// Defaults of Config.
const (
	DefaultBatch       = 1
	DefaultConcurrency = 1
	DefaultMaxWait     = time.Second
	DefaultAckTimeout  = 5 * time.Second
	// DefaultAckWait is the server's AckWait when a consumer's
	// configuration has none (nats-server's default).
	DefaultAckWait = 30 * time.Second
)

// fetchRetryWait is the pause after a failed fetch before the next, cut
// short by stop-claiming.
const fetchRetryWait = time.Second

// Config tunes a Worker. The zero value is valid: one claim loop fetching
// one message at a time.
type Config struct {
	// Batch is the number of messages one fetch asks for (Fetch's batch):
	// 1 or more; 0: DefaultBatch (1). A loop works on a batch's messages in
	// turn; those not started at stop-claiming are Nak'd at once.
	Batch int
	// Concurrency is the number of claim loops, each fetching its own
	// batches, so the handler may run this many times at once: 1 or more;
	// 0: DefaultConcurrency (1).
	Concurrency int
	// MaxWait is how long one fetch waits for messages (FetchMaxWait): it
	// also bounds how long a pending fetch delays the drain after
	// stop-claiming, and how long Run's loops take to see ctx end. Above
	// 0; 0: DefaultMaxWait (1 s).
	MaxWait time.Duration
	// KeepAliveInterval is how often every held message gets an
	// InProgress, which restarts its AckWait on the server. Above 0 and
	// below the consumer's AckWait (or its shortest BackOff step, if
	// shorter); 0: a third of that (10 s for the default AckWait, 30 s).
	KeepAliveInterval time.Duration
	// AckTimeout bounds the server's confirmation of one ack (DoubleAck)
	// and of a hand-back's flush. Above 0; 0: DefaultAckTimeout (5 s).
	AckTimeout time.Duration
}

// Worker is a claim loop on a JetStream pull consumer, with the
// worker.Agent it reports to. Its methods are safe for concurrent use.
type Worker struct {
	agent     *worker.Agent
	nc        *nats.Conn
	cons      js.Consumer
	cfg       Config
	keepAlive time.Duration
	log       logr.Logger

	mu sync.Mutex
	// held are the messages fetched and not yet let go: from the fetch
	// until the claim is done (or handed back); kept alive while unsettled.
	held map[*delivery]struct{}
	// canceledNaks counts the Naks of messages whose handler ended because
	// of the "cancel" fallback, for ReturnClaims to report: they are what
	// the cancel handed back.
	canceledNaks int
	changed      chan struct{} // closed and replaced whenever held changes
	running      bool          // Run was called
}

// delivery is one message delivered to this worker.
type delivery struct {
	msg js.Msg
	// settled says an ack, Nak or Term was sent (or the handler settled
	// the message itself): no more keep-alives, nor another settlement.
	// Guarded by Worker.mu.
	settled bool
	started bool // its handler ran or runs; guarded by Worker.mu
}

// New returns a Worker on the pull consumer cons, reached through nc (the
// connection cons's JetStream context uses; the adapter flushes it after a
// hand-back, so that the Naks reach the server before the claims are
// reported handed back), with a new worker.Agent made from opts.
//
// The adapter sets opts.HandBack and opts.ReturnClaims itself; New returns
// an error naming the field if either is set, and one if nc or cons is nil,
// if cons's AckPolicy is not explicit (Nak and InProgress act on one
// message), if a Config field is out of its range, or if worker.New fails
// (the pod's token, the lease duration).
func New(opts worker.Options, nc *nats.Conn, cons js.Consumer, cfg Config) (*Worker, error) {
	switch {
	case opts.HandBack != nil:
		return nil, errors.New("worker/jetstream: worker.Options.HandBack is set: the adapter hands back unstarted messages itself (Nak); leave it nil")
	case opts.ReturnClaims != nil:
		return nil, errors.New("worker/jetstream: worker.Options.ReturnClaims is set: the adapter returns held messages itself (Nak); leave it nil")
	case nc == nil:
		return nil, errors.New("worker/jetstream: the NATS connection is nil")
	case cons == nil:
		return nil, errors.New("worker/jetstream: the consumer is nil")
	}
	info := cons.CachedInfo()
	if info == nil {
		return nil, errors.New("worker/jetstream: the consumer has no cached info: pass one from JetStream.Consumer, Stream.Consumer or CreateOrUpdateConsumer")
	}
	if info.Config.AckPolicy != js.AckExplicitPolicy {
		return nil, fmt.Errorf("worker/jetstream: consumer %q: AckPolicy %s: want explicit (jetstream.AckExplicitPolicy), so that each message is acked, Nak'd and kept alive on its own", info.Name, info.Config.AckPolicy)
	}
	ackWait := redeliveryAfter(info.Config)
	cfg, keepAlive, err := withDefaults(cfg, ackWait)
	if err != nil {
		return nil, err
	}
	w := &Worker{
		nc:        nc,
		cons:      cons,
		cfg:       cfg,
		keepAlive: keepAlive,
		log:       opts.Logger.WithName("jetstream"),
		held:      map[*delivery]struct{}{},
		changed:   make(chan struct{}),
	}
	opts.HandBack = w.handBack
	opts.ReturnClaims = w.returnClaims
	agent, err := worker.New(opts)
	if err != nil {
		return nil, err
	}
	w.agent = agent
	return w, nil
}

// redeliveryAfter is the shortest time after which the server redelivers
// an unacknowledged message of a consumer with configuration c: AckWait
// (DefaultAckWait if unset), or the shortest BackOff step if one is
// shorter (with BackOff, the n-th delivery waits BackOff[n-1]).
func redeliveryAfter(c js.ConsumerConfig) time.Duration {
	d := c.AckWait
	if d <= 0 {
		d = DefaultAckWait
	}
	for _, b := range c.BackOff {
		if b > 0 && b < d {
			d = b
		}
	}
	return d
}

// withDefaults fills in cfg's defaults and checks its ranges; it returns
// the keep-alive interval for a consumer with AckWait ackWait.
func withDefaults(cfg Config, ackWait time.Duration) (Config, time.Duration, error) {
	switch {
	case cfg.Batch < 0:
		return cfg, 0, fmt.Errorf("worker/jetstream: Config.Batch %d: want 1 or more, or 0 for %d", cfg.Batch, DefaultBatch)
	case cfg.Concurrency < 0:
		return cfg, 0, fmt.Errorf("worker/jetstream: Config.Concurrency %d: want 1 or more, or 0 for %d", cfg.Concurrency, DefaultConcurrency)
	case cfg.MaxWait < 0:
		return cfg, 0, fmt.Errorf("worker/jetstream: Config.MaxWait %s: want a duration above 0, or 0 for %s", cfg.MaxWait, DefaultMaxWait)
	case cfg.AckTimeout < 0:
		return cfg, 0, fmt.Errorf("worker/jetstream: Config.AckTimeout %s: want a duration above 0, or 0 for %s", cfg.AckTimeout, DefaultAckTimeout)
	case cfg.KeepAliveInterval < 0 || cfg.KeepAliveInterval >= ackWait:
		return cfg, 0, fmt.Errorf("worker/jetstream: Config.KeepAliveInterval %s: want a duration above 0 and below the consumer's AckWait %s (or its shortest BackOff step), or 0 for a third of it", cfg.KeepAliveInterval, ackWait)
	}
	if cfg.Batch == 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	keepAlive := cfg.KeepAliveInterval
	if keepAlive == 0 {
		keepAlive = ackWait / 3
	}
	return cfg, keepAlive, nil
}

// Agent is the worker.Agent the Worker reports to: serve its Handler to the
// sidecar, and use it for leadership (Agent.BeginLeading).
func (w *Worker) Agent() *worker.Agent { return w.agent }

// KeepAliveInterval is how often held messages get an InProgress: the
// configured Config.KeepAliveInterval, or a third of the consumer's AckWait
// (or of its shortest BackOff step, if shorter).
func (w *Worker) KeepAliveInterval() time.Duration { return w.keepAlive }

// Run runs the claim loops (Config.Concurrency) until claiming stops, then
// waits until every message it held is settled and returns nil; or until
// ctx ends, and returns ctx's error. handle works on one message with the
// claim's context (worker.Claim.Context: ended by the "cancel" fallback
// with cause worker.ErrCanceled, and when ctx ends); it must be safe to
// call Concurrency times at once. It returns nil to ack the message
// (DoubleAck), or an error to Nak it. It may settle the message itself
// first (Msg.Term, Msg.NakWithDelay): Run then leaves it as it is.
//
// The messages of a fetch not started when claiming stops are Nak'd by the
// Agent at once (they are not passed to handle); those whose hand-back
// failed are Nak'd again at the drain deadline, so Run may wait until then.
// Run may be called once; a second call returns an error.
func (w *Worker) Run(ctx context.Context, handle func(ctx context.Context, msg js.Msg) error) error {
	if handle == nil {
		return errors.New("worker/jetstream: Run: handle is nil")
	}
	w.mu.Lock()
	if w.running {
		w.mu.Unlock()
		return errors.New("worker/jetstream: Run called twice")
	}
	w.running = true
	w.mu.Unlock()

	keepCtx, stopKeep := context.WithCancel(context.Background())
	keptAlive := make(chan struct{})
	go func() { defer close(keptAlive); w.keepAliveLoop(keepCtx) }()
	defer func() { stopKeep(); <-keptAlive }()

	var loops sync.WaitGroup
	for range w.cfg.Concurrency {
		loops.Add(1)
		go func() { defer loops.Done(); w.claimLoop(ctx, handle) }()
	}
	loops.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	// Claiming stopped: wait for the Agent's hand-back of what is left.
	return w.waitReleased(ctx)
}

// claimLoop fetches and works on batches until claiming stops or ctx ends.
func (w *Worker) claimLoop(ctx context.Context, handle func(context.Context, js.Msg) error) {
	for {
		r, err := w.agent.Receive(ctx)
		if err != nil { // worker.ErrStopping, or ctx ended
			return
		}
		claims, ds := w.fetch(r)
		r.End()
		for i, c := range claims {
			w.work(ctx, c, ds[i], handle)
		}
	}
}

// fetch fetches one batch for the pending receive r and holds each message
// as it arrives, unstarted. The fetch runs with no context: cut off at
// stop-claiming, it would drop messages the server already delivered, and
// they would wait out AckWait; it ends within MaxWait, and messages it
// brings after stop-claiming are handed back by the Agent at once. After a
// failed fetch it waits fetchRetryWait, or until r ends.
func (w *Worker) fetch(r *worker.Receive) ([]*worker.Claim, []*delivery) {
	batch, err := w.cons.Fetch(w.cfg.Batch, js.FetchMaxWait(w.cfg.MaxWait))
	if err != nil {
		w.log.Error(err, "fetch failed")
		wait(r.Context(), fetchRetryWait)
		return nil, nil
	}
	var claims []*worker.Claim
	var ds []*delivery
	for m := range batch.Messages() {
		d := &delivery{msg: m}
		w.mu.Lock()
		w.held[d] = struct{}{}
		w.changedLocked()
		w.mu.Unlock()
		claims = append(claims, r.HoldUnstarted(d))
		ds = append(ds, d)
	}
	if err := batch.Error(); err != nil {
		w.log.Error(err, "fetch ended with an error", "messages", len(ds))
		if len(ds) == 0 {
			wait(r.Context(), fetchRetryWait)
		}
	}
	return claims, ds
}

// work starts claim c of delivery d, runs handle on it and settles it: ack
// on nil, Nak on an error. A claim the Agent took to hand back is skipped
// (the Agent ends it), and so is one ReturnClaims already handed back.
func (w *Worker) work(ctx context.Context, c *worker.Claim, d *delivery, handle func(context.Context, js.Msg) error) {
	if c.Start() != nil { // worker.ErrHandedBack: handBack has it
		return
	}
	defer func() { w.release(d); c.Done() }()
	w.mu.Lock()
	skip := d.settled
	d.started = true
	w.mu.Unlock()
	if skip { // handed back by ReturnClaims before it started
		return
	}
	if ctx.Err() != nil { // Run is ending: hand it back without working on it
		w.settle(d, "Nak", func(js.Msg) error { return d.msg.Nak() })
		return
	}
	err := handle(c.Context(), d.msg)
	if err == nil {
		if !w.settle(d, "ack", func(m js.Msg) error {
			actx, cancel := context.WithTimeout(context.Background(), w.cfg.AckTimeout)
			defer cancel()
			return m.DoubleAck(actx)
		}) {
			w.logSettledBefore(d)
		}
		return
	}
	canceled := errors.Is(context.Cause(c.Context()), worker.ErrCanceled)
	if w.settle(d, "Nak", func(m js.Msg) error { return m.Nak() }) {
		if canceled {
			w.mu.Lock()
			w.canceledNaks++
			w.mu.Unlock()
		}
		return
	}
	w.logSettledBefore(d)
}

// logSettledBefore logs a handler that ended on a message already handed
// back at the drain deadline.
func (w *Worker) logSettledBefore(d *delivery) {
	if meta, err := d.msg.Metadata(); err == nil {
		w.log.Info("handler ended after its message was handed back at the drain deadline", "streamSequence", meta.Sequence.Stream)
	}
}

// settle sends one settlement (ack, Nak) of d with send, unless d is
// settled already, and says whether it sent it. A failed Nak leaves d
// unsettled, so a later hand-back tries again; a failed ack does not (the
// work is done: the message comes back after AckWait at worst). If the
// handler settled the message itself, the client refuses with
// ErrMsgAlreadyAckd, which counts as settled.
func (w *Worker) settle(d *delivery, what string, send func(js.Msg) error) bool {
	w.mu.Lock()
	if d.settled {
		w.mu.Unlock()
		return false
	}
	d.settled = true
	w.mu.Unlock()
	err := send(d.msg)
	if err == nil || errors.Is(err, js.ErrMsgAlreadyAckd) {
		return true
	}
	w.log.Error(err, what+" failed")
	if what == "Nak" {
		w.mu.Lock()
		d.settled = false
		w.mu.Unlock()
		return false
	}
	return true
}

// release lets d go: no more keep-alives.
func (w *Worker) release(d *delivery) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.held[d]; ok {
		delete(w.held, d)
		w.changedLocked()
	}
}

// flush waits until the server has every Nak sent before it, bounded by
// ctx and by Config.AckTimeout: nats.go's FlushWithContext refuses a
// context without a deadline, and ReturnClaims gets the context of the
// sidecar's call, which has none of its own.
func (w *Worker) flush(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.AckTimeout)
	defer cancel()
	return w.nc.FlushWithContext(ctx)
}

// handBack is worker.Options.HandBack: it Naks each unstarted claim's
// message and flushes the connection, so they reach the server before it
// returns.
func (w *Worker) handBack(ctx context.Context, claims []*worker.Claim) error {
	var errs []error
	for _, c := range claims {
		d := c.Value().(*delivery)
		w.settle(d, "Nak", func(m js.Msg) error {
			err := m.Nak()
			if err != nil {
				errs = append(errs, err)
			}
			return err
		})
	}
	if err := w.flush(ctx); err != nil {
		errs = append(errs, fmt.Errorf("flush: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("worker/jetstream: hand back %d unstarted messages: %w", len(claims), err)
	}
	for _, c := range claims {
		w.release(c.Value().(*delivery))
	}
	return nil
}

// returnClaims is worker.Options.ReturnClaims: at the drain deadline it
// Naks every held message not settled, started or not, flushes the
// connection, and returns how many it Nak'd plus how many handlers ended by
// the "cancel" fallback were Nak'd since the last call.
func (w *Worker) returnClaims(ctx context.Context) (int, error) {
	w.mu.Lock()
	ds := make([]*delivery, 0, len(w.held))
	for d := range w.held {
		ds = append(ds, d)
	}
	w.mu.Unlock()
	n := 0
	var errs []error
	for _, d := range ds {
		if w.settle(d, "Nak", func(m js.Msg) error {
			err := m.Nak()
			if err != nil {
				errs = append(errs, err)
			}
			return err
		}) {
			n++
		}
		w.mu.Lock()
		started := d.started
		w.mu.Unlock()
		if !started {
			// Unstarted: its claim is one whose hand-back failed, which the
			// Agent ends after this call. A started one is let go by its
			// loop when its handler returns.
			w.release(d)
		}
	}
	if err := w.flush(ctx); err != nil {
		errs = append(errs, fmt.Errorf("flush: %w", err))
	}
	w.mu.Lock()
	n += w.canceledNaks
	w.canceledNaks = 0
	w.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return n, fmt.Errorf("worker/jetstream: return held messages: %w", err)
	}
	return n, nil
}

// keepAliveLoop sends InProgress for every held, unsettled message every
// keepAlive until ctx ends. It holds w.mu while it sends (InProgress is a
// buffered publish), so that no keep-alive follows a settlement on the
// wire: the server applies a late InProgress to whatever delivery of the
// message is pending, maybe another worker's.
func (w *Worker) keepAliveLoop(ctx context.Context) {
	t := time.NewTicker(w.keepAlive)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.mu.Lock()
		for d := range w.held {
			if d.settled {
				continue
			}
			if err := d.msg.InProgress(); err != nil && !errors.Is(err, js.ErrMsgAlreadyAckd) {
				w.log.Error(err, "keep-alive (InProgress) failed")
			}
		}
		w.mu.Unlock()
	}
}

// waitReleased waits until no message is held, or ctx ends.
func (w *Worker) waitReleased(ctx context.Context) error {
	for {
		w.mu.Lock()
		n, changed := len(w.held), w.changed
		w.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// changedLocked wakes waitReleased; w.mu must be held.
func (w *Worker) changedLocked() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// wait waits for d, or until ctx ends.
func wait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
