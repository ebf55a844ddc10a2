// Package rabbitmq is the handoff adapter for a RabbitMQ queue consumer
// (github.com/rabbitmq/amqp091-go; tested on RabbitMQ 3.10).
//
// An Adapter consumes one queue on a channel of its own, with manual
// acknowledgements and a prefetch of Config.Prefetch, and maps the
// protocol's steps onto AMQP's:
//
//   - Claiming: every delivery is held unstarted as it arrives
//     (worker.Receive.HoldUnstarted): delivered, not acknowledged, and not
//     yet worked, it is a prefetched message. Config.Concurrency workers
//     take them in delivery order, start, handle and acknowledge
//     (basic.ack) them.
//   - Stop claiming: the consumer is cancelled (basic.cancel, waiting for
//     cancel-ok), so the broker delivers nothing more; deliveries already
//     on the way arrive before cancel-ok and are held too.
//   - Unstarted (prefetched) deliveries are handed back at stop-claiming
//     (worker.Options.HandBack) with basic.nack requeue=true: the broker
//     puts them back in the queue at once and delivers them to the other
//     consumers, with Redelivered set.
//   - Hand back at the drain deadline (worker.Options.ReturnClaims): every
//     delivery not yet acknowledged, started or not, is nacked with
//     requeue. A handler that finishes after that is not acknowledged (the
//     delivery tag is no longer this channel's: an ack would close it), so
//     its message may be done twice.
//   - Keep-alive: RabbitMQ has no visibility timeout to extend. A delivery
//     stays this consumer's, however long the work or the drain, until it
//     is acknowledged, nacked, or the channel or connection closes. The one
//     limit is the broker's delivery acknowledgement timeout
//     (consumer_timeout in rabbitmq.conf, 30 min by default since 3.8.17;
//     per queue or consumer only in later releases): a delivery left
//     unacknowledged longer closes the channel with PRECONDITION_FAILED and
//     requeues all its deliveries. Keep the drain deadline (the Pod's grace
//     period) and the longest work below it.
//
// Delivery is at least once: a handler's error nacks the delivery with
// requeue, so it is delivered again at once (to this or another consumer);
// bound retries with a quorum queue's delivery-limit.
package rabbitmq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"github.com/go-logr/logr"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/handoff-dev/handoff/worker"
)

// DefaultPrefetch is Config.Prefetch's default.
const DefaultPrefetch = 10

// Config says which queue an Adapter consumes, and how.
type Config struct {
	// Queue is the queue to consume; it must exist. Required.
	Queue string
	// ConsumerTag is the consumer's tag on its channel. Empty: "handoff-"
	// and 16 random hex digits.
	ConsumerTag string
	// Prefetch is the most deliveries not yet acknowledged the broker
	// sends this consumer (basic.qos prefetch-count): those being worked and
	// those waiting, unstarted, to be. Zero: DefaultPrefetch (10).
	Prefetch int
	// Concurrency is the number of deliveries handled at once. Zero: 1.
	// More than Prefetch is no use.
	Concurrency int
	// Args are the consumer's arguments (basic.consume), like
	// "x-priority". Nil: none.
	Args amqp.Table
}

// Adapter is one consumer of a RabbitMQ queue, with the handoff Agent that
// hands its deliveries over. Its methods are safe for concurrent use.
type Adapter struct {
	agent *worker.Agent
	conn  *amqp.Connection
	cfg   Config
	log   logr.Logger

	// mu guards ch and unacked, and serialises acknowledgements: a delivery
	// tag is acked or nacked once, and only while it is this channel's
	// (acking one twice closes the channel).
	mu      sync.Mutex
	ch      *amqp.Channel
	unacked map[uint64]struct{} // delivery tags not yet acked or nacked
	// canceledNacks counts the nacks of deliveries whose handler ended
	// because of the "cancel" fallback, since the last returnClaims.
	canceledNacks int
	// cancel cancels the consumer, once (basic.cancel, waiting for
	// cancel-ok); set by Run.
	cancel func()
}

// New returns an Adapter consuming cfg.Queue on a channel of conn, with an
// Agent made from opts (worker.New) whose HandBack and ReturnClaims are
// the adapter's. It returns an error if opts.HandBack or opts.ReturnClaims
// is set, conn is nil, a Config field is out of range (naming it and the
// accepted values), or worker.New fails. It does not talk to the broker.
func New(opts worker.Options, conn *amqp.Connection, cfg Config) (*Adapter, error) {
	if opts.HandBack != nil {
		return nil, errors.New("rabbitmq: worker.Options.HandBack is set: the adapter hands back prefetched deliveries itself; leave it nil")
	}
	if opts.ReturnClaims != nil {
		return nil, errors.New("rabbitmq: worker.Options.ReturnClaims is set: the adapter returns its unacknowledged deliveries itself; leave it nil")
	}
	if conn == nil {
		return nil, errors.New("rabbitmq: the *amqp.Connection is nil")
	}
	switch {
	case cfg.Queue == "":
		return nil, errors.New("rabbitmq: Config.Queue is empty: want the name of the queue to consume")
	case cfg.Prefetch < 0 || cfg.Prefetch > 65535:
		return nil, fmt.Errorf("rabbitmq: Config.Prefetch %d: want 0 (%d) or from 1 to 65535", cfg.Prefetch, DefaultPrefetch)
	case cfg.Concurrency < 0:
		return nil, fmt.Errorf("rabbitmq: Config.Concurrency %d: want 0 (1) or more", cfg.Concurrency)
	}
	if cfg.Prefetch == 0 {
		cfg.Prefetch = DefaultPrefetch
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	if cfg.ConsumerTag == "" {
		var b [8]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
		cfg.ConsumerTag = "handoff-" + hex.EncodeToString(b[:])
	}
	a := &Adapter{conn: conn, cfg: cfg, log: opts.Logger, unacked: map[uint64]struct{}{}}
	opts.HandBack = a.handBack
	opts.ReturnClaims = a.returnClaims
	var err error
	if a.agent, err = worker.New(opts); err != nil {
		return nil, err
	}
	return a, nil
}

// Agent returns the Agent that serves the handoff sidecar (Agent.Handler).
func (a *Adapter) Agent() *worker.Agent { return a.agent }

// ErrChannelClosed is returned by Run when the broker or the connection
// closed the channel before claiming stopped (the wrapped *amqp.Error says
// why, like a consumer_timeout's PRECONDITION_FAILED); the broker has
// requeued its unacknowledged deliveries.
var ErrChannelClosed = errors.New("rabbitmq: channel closed")

// Run opens a channel, sets its prefetch and consumes Config.Queue,
// calling handle for each delivery (Config.Concurrency at a time) and
// acknowledging those handle returns nil for; a delivery handle fails is
// nacked with requeue. handle's ctx is the claim's (worker.Claim.Context):
// it ends with ctx and with the sidecar's "cancel" fallback.
//
// Run returns nil once claiming has stopped and every claim is done
// (handled, or handed back), and it has closed its channel; an error
// wrapping ErrChannelClosed if the broker closed the channel instead. It returns ctx's
// error once ctx ends and the handlers have returned (closing the channel
// requeues what was not acknowledged), an error wrapping ErrChannelClosed,
// or the error of opening the channel, basic.qos or basic.consume.
func (a *Adapter) Run(ctx context.Context, handle func(ctx context.Context, d amqp.Delivery) error) error {
	ch, err := a.conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	defer func() { _ = ch.Close() }() // requeues anything not acknowledged
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Qos(a.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("rabbitmq: basic.qos prefetch-count %d: %w", a.cfg.Prefetch, err)
	}
	a.mu.Lock()
	a.ch = ch
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.ch, a.cancel = nil, nil
		clear(a.unacked) // the channel's tags go with it
		a.mu.Unlock()
	}()

	r, err := a.agent.Receive(ctx)
	if err != nil { // stopped before Run, or ctx ended
		if errors.Is(err, worker.ErrStopping) {
			return nil
		}
		return err
	}
	// Consume, not ConsumeWithContext: its goroutine sends basic.cancel when
	// ctx ends, whatever the channel is doing, and a frame that reaches the
	// broker after our channel.close is a connection error (504
	// CHANNEL_ERROR), which ends every channel of the connection.
	// cancelConsumer below runs at ctx's end too (r's context ends with it).
	deliveries, err := ch.Consume(a.cfg.Queue, a.cfg.ConsumerTag, false, false, false, false, a.cfg.Args)
	if err != nil {
		r.End()
		return fmt.Errorf("rabbitmq: basic.consume %s: %w", a.cfg.Queue, err)
	}

	type job struct {
		c *worker.Claim
		d amqp.Delivery
	}
	// At most Prefetch deliveries are unacknowledged, so the queue never
	// blocks the receive loop.
	jobs := make(chan job, a.cfg.Prefetch)
	var workers sync.WaitGroup
	for range a.cfg.Concurrency {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for j := range jobs {
				if j.c.Start() != nil { // worker.ErrHandedBack: handBack has it
					continue
				}
				a.work(j.c, j.d, handle)
			}
		}()
	}

	// One receive stays pending while the consumer is on: deliveries are
	// pushed, any time. Stop-claiming cancels the consumer; the deliveries
	// channel closes once the broker's cancel-ok came, after every delivery
	// sent before it.
	// basic.cancel and channel.close take turns (closing): nothing is sent
	// on the channel once its close has begun.
	var closing struct {
		sync.Mutex
		begun bool
	}
	cancelConsumer := sync.OnceFunc(func() {
		closing.Lock()
		defer closing.Unlock()
		if closing.begun {
			return
		}
		if err := ch.Cancel(a.cfg.ConsumerTag, false); err != nil && ctx.Err() == nil {
			a.log.Error(err, "basic.cancel failed", "queue", a.cfg.Queue)
		}
	})
	closeChannel := func() {
		closing.Lock()
		closing.begun = true
		closing.Unlock()
		a.mu.Lock()
		a.ch = nil // no ack or nack after this (settle): the close requeues what is left
		a.mu.Unlock()
		_ = ch.Close()
	}
	defer closeChannel() // deferred last, so run first: the Close deferred above is then a no-op
	a.mu.Lock()
	a.cancel = cancelConsumer
	a.mu.Unlock()
	canceled := context.AfterFunc(r.Context(), cancelConsumer)
	for d := range deliveries {
		a.mu.Lock()
		a.unacked[d.DeliveryTag] = struct{}{}
		a.mu.Unlock()
		jobs <- job{r.HoldUnstarted(d.DeliveryTag), d}
	}
	canceled()
	r.End()
	close(jobs)
	workers.Wait()

	select {
	case <-a.agent.Stopping():
		// Unstarted claims are handed back by the Agent on this channel:
		// wait for them before closing it.
		if err := a.agent.WaitDrained(ctx); err != nil {
			return err
		}
		// Close returns once the channel is shut down, by our close or by
		// the broker's (an ack it refused: it answers the frames of a
		// channel in order), which then is in closed.
		closeChannel()
		if e := <-closed; e != nil {
			return fmt.Errorf("%w by the broker during the drain: %w", ErrChannelClosed, e)
		}
		return nil
	default:
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return fmt.Errorf("%w: %w", ErrChannelClosed, <-closed)
}

// work handles one started delivery, acks it (or nacks it with requeue if
// handle failed), and ends the claim.
func (a *Adapter) work(c *worker.Claim, d amqp.Delivery, handle func(context.Context, amqp.Delivery) error) {
	defer c.Done()
	if err := handle(c.Context(), d); err != nil {
		a.log.Info("handler failed; delivery requeued", "deliveryTag", d.DeliveryTag, "error", err.Error())
		canceled := errors.Is(context.Cause(c.Context()), worker.ErrCanceled)
		nacked, err := a.settle(d.DeliveryTag, false)
		if err != nil {
			a.log.Error(err, "basic.nack failed", "deliveryTag", d.DeliveryTag)
		}
		if nacked && err == nil && canceled {
			// Handed back because of the cancel fallback: the next
			// return counts it (docs/protocol.md, "returned").
			a.mu.Lock()
			a.canceledNacks++
			a.mu.Unlock()
		}
		return
	}
	if _, err := a.settle(d.DeliveryTag, true); err != nil {
		a.log.Error(err, "basic.ack failed", "deliveryTag", d.DeliveryTag)
	}
}

// settle acks (ack) or nacks with requeue the delivery tag if it is still
// unacknowledged on the channel, and says whether it was.
func (a *Adapter) settle(tag uint64, ack bool) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.unacked[tag]; !ok || a.ch == nil {
		return false, nil // handed back already, or its channel is gone
	}
	delete(a.unacked, tag)
	if ack {
		return true, a.ch.Ack(tag, false)
	}
	return true, a.ch.Nack(tag, false, true)
}

// handBack is the Agent's HandBack: it nacks the prefetched deliveries
// with requeue. It runs after stop-claiming only, and cancels the consumer
// first (if stop-claiming's cancel has not yet), so the broker gives them
// to the other consumers, not back to this one.
func (a *Adapter) handBack(_ context.Context, claims []*worker.Claim) error {
	a.mu.Lock()
	cancel := a.cancel
	a.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	n := 0
	for _, c := range claims {
		ok, err := a.settle(c.Value().(uint64), false)
		if err != nil {
			return fmt.Errorf("rabbitmq: basic.nack requeue: %w", err)
		}
		if ok {
			n++
		}
	}
	a.log.Info("handed back", "count", n)
	return nil
}

// returnClaims is the Agent's ReturnClaims: it nacks with requeue every
// delivery not yet acknowledged, and returns how many it nacked plus how
// many deliveries whose handler ended because of the "cancel" fallback
// were nacked since the last call.
func (a *Adapter) returnClaims(context.Context) (int, error) {
	a.mu.Lock()
	tags := make([]uint64, 0, len(a.unacked))
	for tag := range a.unacked {
		tags = append(tags, tag)
	}
	a.mu.Unlock()
	n := 0
	for _, tag := range tags {
		ok, err := a.settle(tag, false)
		if err != nil {
			return n, fmt.Errorf("rabbitmq: basic.nack requeue: %w", err)
		}
		if ok {
			n++
		}
	}
	a.mu.Lock()
	n += a.canceledNacks
	a.canceledNacks = 0
	a.mu.Unlock()
	return n, nil
}
