package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	js "github.com/nats-io/nats.go/jetstream"

	"github.com/handoff-dev/handoff/internal/natstest"
	"github.com/handoff-dev/handoff/worker"
	"github.com/handoff-dev/handoff/worker/jetstream"
)

func TestMain(m *testing.M) { natstest.Run(m) }

// testTimeout bounds every wait of a test; an outcome not reached by then
// fails it.
const testTimeout = 60 * time.Second

// queue is one stream with one durable pull consumer on the test server.
type queue struct {
	t       *testing.T
	stream  string
	subject string
	js      js.JetStream
}

// newQueue makes a stream and a durable consumer "c" on it with AckWait
// ackWait and explicit acks.
func newQueue(t *testing.T, ackWait time.Duration) *queue {
	t.Helper()
	q := &queue{t: t, stream: natstest.StreamName(t)}
	q.subject = q.stream + ".work"
	var err error
	q.js, err = js.New(natstest.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := q.ctx()
	if _, err := q.js.CreateStream(ctx, js.StreamConfig{Name: q.stream, Subjects: []string{q.subject}}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	if _, err := q.js.CreateConsumer(ctx, q.stream, js.ConsumerConfig{Durable: "c", AckPolicy: js.AckExplicitPolicy, AckWait: ackWait}); err != nil {
		t.Fatalf("create consumer: %v", err)
	}
	t.Cleanup(func() { _ = q.js.DeleteStream(context.Background(), q.stream) })
	return q
}

func (q *queue) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	q.t.Cleanup(cancel)
	return ctx
}

// publish publishes messages with the bodies ids, in order.
func (q *queue) publish(ids ...string) {
	q.t.Helper()
	for _, id := range ids {
		if _, err := q.js.Publish(q.ctx(), q.subject, []byte(id)); err != nil {
			q.t.Fatalf("publish %s: %v", id, err)
		}
	}
}

// consumer returns consumer "c" on a connection of its own: another
// worker's view of the queue.
func (q *queue) consumer() (*nats.Conn, js.Consumer) {
	q.t.Helper()
	nc := natstest.Connect(q.t)
	j, err := js.New(nc)
	if err != nil {
		q.t.Fatal(err)
	}
	c, err := j.Consumer(q.ctx(), q.stream, "c")
	if err != nil {
		q.t.Fatalf("consumer: %v", err)
	}
	return nc, c
}

// info returns consumer "c"'s state on the server.
func (q *queue) info() *js.ConsumerInfo {
	q.t.Helper()
	c, err := q.js.Consumer(q.ctx(), q.stream, "c")
	if err != nil {
		q.t.Fatal(err)
	}
	info, err := c.Info(q.ctx())
	if err != nil {
		q.t.Fatal(err)
	}
	return info
}

// fetchOthers fetches up to n messages as another consumer would, waiting
// up to wait, and returns their bodies and delivery counts, unacked.
func (q *queue) fetchOthers(c js.Consumer, n int, wait time.Duration) ([]string, []uint64) {
	q.t.Helper()
	b, err := c.Fetch(n, js.FetchMaxWait(wait))
	if err != nil {
		q.t.Fatalf("fetch: %v", err)
	}
	var ids []string
	var deliveries []uint64
	for m := range b.Messages() {
		meta, err := m.Metadata()
		if err != nil {
			q.t.Fatal(err)
		}
		ids = append(ids, string(m.Data()))
		deliveries = append(deliveries, meta.NumDelivered)
	}
	return ids, deliveries
}

// newWorker returns an adapter on a connection of its own to q's
// consumer.
func newWorker(t *testing.T, q *queue, cfg jetstream.Config) *jetstream.Worker {
	t.Helper()
	nc, c := q.consumer()
	w, err := jetstream.New(worker.Options{InsecureNoToken: true}, nc, c, cfg)
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	return w
}

// run runs w.Run in a goroutine and returns the channel its result comes
// on. The test fails if Run has not returned when the test ends.
func run(t *testing.T, w *jetstream.Worker, handle func(context.Context, js.Msg) error) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() { defer close(finished); done <- w.Run(ctx, handle) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(testTimeout):
			t.Error("Run did not return after its context ended")
		}
	})
	return done
}

// waitRun waits for Run's result and fails t unless it is nil.
func waitRun(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(testTimeout):
		t.Fatalf("Run did not return within %s", testTimeout)
	}
}

// eventually polls cond until it holds, or fails t after testTimeout.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", testTimeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// applied records the messages a handler applied, by body.
type applied struct {
	mu    sync.Mutex
	count map[string]int
	order []string
}

func newApplied() *applied { return &applied{count: map[string]int{}} }

func (a *applied) add(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.count[id]++
	a.order = append(a.order, id)
}

func (a *applied) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.order)
}

func (a *applied) ids() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.order...)
}

// hour is an AckWait no test outlives: a message that comes back to
// another consumer within a test was handed back, not redelivered by
// timeout.
const hour = time.Hour

// TestStopClaimingStopsIntake: after stop-claiming the worker takes no
// new message and works on none: the fetch under way then (waiting on
// the server) is not cut off, and the message it brings is handed back at
// once, not left to AckWait; the rest stay the queue's. Another consumer
// gets them all, and Run returns once its work is done.
func TestStopClaimingStopsIntake(t *testing.T) {
	q := newQueue(t, hour)
	w := newWorker(t, q, jetstream.Config{MaxWait: 20 * time.Second})
	got := newApplied()
	done := run(t, w, func(_ context.Context, m js.Msg) error { got.add(string(m.Data())); return nil })

	q.publish("1", "2", "3")
	eventually(t, "3 messages applied", func() bool { return got.len() == 3 })
	eventually(t, "the next fetch waiting on the server", func() bool { return q.info().NumWaiting == 1 })
	w.Agent().StopClaiming()
	q.publish("4", "5", "6") // "4" goes to the fetch under way
	waitRun(t, done)

	if ids := got.ids(); strings.Join(ids, ",") != "1,2,3" {
		t.Fatalf("applied %v, want only [1 2 3], published before stop-claiming", ids)
	}
	if n := w.Agent().InFlight(); n != 0 {
		t.Fatalf("InFlight after Run: %d, want 0", n)
	}
	_, other := q.consumer()
	ids, deliveries := q.fetchOthers(other, 3, 10*time.Second)
	if strings.Join(ids, ",") != "4,5,6" || !slices.Equal(deliveries, []uint64{2, 1, 1}) {
		t.Fatalf("another consumer got %v (deliveries %v), want [4 5 6] (deliveries [2 1 1]: 4 handed back by the worker)", ids, deliveries)
	}
}

// TestDrainCounts: a fetched batch is held in flight, the messages not
// started are unstarted; stop-claiming hands those back (Nak) at once, so
// another consumer gets them, and only the started one drains.
func TestDrainCounts(t *testing.T) {
	q := newQueue(t, hour)
	q.publish("1", "2", "3") // before Run: the first fetch gets all three
	w := newWorker(t, q, jetstream.Config{Batch: 3})
	started := make(chan string, 3)
	release := make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	got := newApplied()
	done := run(t, w, func(_ context.Context, m js.Msg) error {
		started <- string(m.Data())
		<-release
		got.add(string(m.Data()))
		return nil
	})
	t.Cleanup(unblock) // before run's cleanup waits for Run

	if id := <-started; id != "1" {
		t.Fatalf("first message started: %s, want 1", id)
	}
	a := w.Agent()
	eventually(t, "in flight 3, unstarted 2", func() bool { return a.InFlight() == 3 && a.Unstarted() == 2 })

	a.StopClaiming()
	eventually(t, "in flight 1, unstarted 0 after stop-claiming", func() bool { return a.InFlight() == 1 && a.Unstarted() == 0 })
	_, other := q.consumer()
	ids, deliveries := q.fetchOthers(other, 2, 10*time.Second)
	if sorted := slices.Sorted(slices.Values(ids)); strings.Join(sorted, ",") != "2,3" {
		t.Fatalf("another consumer got %v after stop-claiming, want the unstarted [2 3]", ids)
	}
	for i, n := range deliveries {
		if n != 2 {
			t.Errorf("message %s delivered %d times, want 2 (to the worker, then handed back)", ids[i], n)
		}
	}

	unblock()
	waitRun(t, done)
	if ids := got.ids(); strings.Join(ids, ",") != "1" {
		t.Fatalf("applied %v, want [1]: the unstarted ones were handed back", ids)
	}
	if n := a.InFlight(); n != 0 {
		t.Fatalf("InFlight after Run: %d, want 0", n)
	}
	if info := q.info(); info.NumAckPending != 2 { // 2 and 3, held by the other consumer
		t.Fatalf("ack pending %d, want 2 (message 1 acked)", info.NumAckPending)
	}
}

// TestReturnClaims: at the drain deadline the message still being worked
// on is handed back (Nak) and another consumer gets it at once, with the
// "return" fallback (the handler still runs) and with "cancel" (the
// handler ends on its canceled context).
func TestReturnClaims(t *testing.T) {
	for _, cancel := range []bool{false, true} {
		t.Run(map[bool]string{false: "return", true: "cancel"}[cancel], func(t *testing.T) {
			q := newQueue(t, hour)
			w := newWorker(t, q, jetstream.Config{})
			started := make(chan struct{})
			release := make(chan struct{})
			var handlerErr error
			done := run(t, w, func(ctx context.Context, _ js.Msg) error {
				close(started)
				if cancel {
					<-ctx.Done()
					handlerErr = context.Cause(ctx)
					return ctx.Err()
				}
				<-release // ignores cancellation
				return nil
			})
			unblock := sync.OnceFunc(func() { close(release) })
			t.Cleanup(unblock) // before run's cleanup waits for Run
			q.publish("1")
			<-started
			a := w.Agent()
			a.StopClaiming()

			returned, err := a.Return(q.ctx(), cancel, 10*time.Second)
			if err != nil {
				t.Fatalf("Return: %v", err)
			}
			if returned != 1 {
				t.Fatalf("Return: %d returned, want 1", returned)
			}
			_, other := q.consumer()
			ids, deliveries := q.fetchOthers(other, 1, 10*time.Second)
			if len(ids) != 1 || ids[0] != "1" || deliveries[0] != 2 {
				t.Fatalf("another consumer got %v (deliveries %v), want message 1 on its second delivery", ids, deliveries)
			}
			if cancel && !errors.Is(handlerErr, worker.ErrCanceled) {
				t.Fatalf("handler's context cause %v, want worker.ErrCanceled", handlerErr)
			}
			unblock()
			waitRun(t, done)
			// Handed back before the handler ended: not acked by it.
			if info := q.info(); info.NumAckPending != 1 {
				t.Fatalf("ack pending %d, want 1: the other consumer's delivery (the worker's late ack must not count)", info.NumAckPending)
			}
			if again, err := a.Return(q.ctx(), cancel, time.Second); err != nil || again != 0 {
				t.Fatalf("Return again: %d, %v; want 0, nil", again, err)
			}
		})
	}
}

// TestKeepAliveDuringLongDrain: a handler that runs three AckWaits past
// stop-claiming keeps its message: another consumer fetching all along
// never gets it, and it is acked once, on its first delivery.
func TestKeepAliveDuringLongDrain(t *testing.T) {
	const ackWait = 2 * time.Second
	q := newQueue(t, ackWait)
	w := newWorker(t, q, jetstream.Config{})
	started := make(chan struct{})
	var deliveries uint64
	done := run(t, w, func(_ context.Context, m js.Msg) error {
		meta, err := m.Metadata()
		if err != nil {
			return err
		}
		deliveries = meta.NumDelivered
		close(started)
		time.Sleep(3 * ackWait) // the work: longer than AckWait
		return nil
	})
	q.publish("1")
	<-started
	w.Agent().StopClaiming() // the drain: waits for the handler

	stopRival := fetchAll(q)
	t.Cleanup(func() { stopRival() })
	waitRun(t, done)
	if got := stopRival(); len(got) != 0 {
		t.Fatalf("another consumer got %v while the handler ran: redelivered past AckWait %s (keep-alive every %s)", got, ackWait, w.KeepAliveInterval())
	}
	if deliveries != 1 {
		t.Fatalf("handler saw delivery %d, want 1", deliveries)
	}
	if info := q.info(); info.NumAckPending != 0 || info.NumRedelivered != 0 || info.NumPending != 0 {
		t.Fatalf("consumer: ack pending %d, redelivered %d, pending %d; want 0, 0, 0", info.NumAckPending, info.NumRedelivered, info.NumPending)
	}
}

// TestKeepAliveUnstarted: the rest of a batch, held unstarted while the
// first message's handler runs past AckWait, is kept too: another consumer
// fetching all along gets none of it, and each message is applied once,
// on its first delivery.
func TestKeepAliveUnstarted(t *testing.T) {
	const ackWait = 2 * time.Second
	q := newQueue(t, ackWait)
	q.publish("1", "2") // before Run: one fetch gets both
	w := newWorker(t, q, jetstream.Config{Batch: 2})
	got := newApplied()
	var mu sync.Mutex
	var redelivered []string
	done := run(t, w, func(_ context.Context, m js.Msg) error {
		meta, err := m.Metadata()
		if err != nil {
			return err
		}
		if meta.NumDelivered != 1 {
			mu.Lock()
			redelivered = append(redelivered, string(m.Data()))
			mu.Unlock()
		}
		if string(m.Data()) == "1" {
			time.Sleep(3 * ackWait / 2) // "2" waits unstarted past AckWait
		}
		got.add(string(m.Data()))
		return nil
	})
	stopRival := fetchAll(q)
	t.Cleanup(func() { stopRival() })
	eventually(t, "both applied", func() bool { return got.len() == 2 })
	if got := stopRival(); len(got) != 0 {
		t.Fatalf("another consumer got %v while the batch was held: redelivered past AckWait %s", got, ackWait)
	}
	w.Agent().StopClaiming()
	waitRun(t, done)
	if ids := got.ids(); strings.Join(ids, ",") != "1,2" {
		t.Fatalf("applied %v, want [1 2]", ids)
	}
	if len(redelivered) != 0 {
		t.Fatalf("the handler got %v on a redelivery, want none", redelivered)
	}
	if info := q.info(); info.NumAckPending != 0 || info.NumRedelivered != 0 {
		t.Fatalf("consumer: ack pending %d, redelivered %d; want 0, 0", info.NumAckPending, info.NumRedelivered)
	}
}

// TestHandlerErrorNaks: a handler's error hands the message back at once:
// another consumer gets it on its second delivery.
func TestHandlerErrorNaks(t *testing.T) {
	q := newQueue(t, hour)
	w := newWorker(t, q, jetstream.Config{})
	failed := make(chan struct{})
	done := run(t, w, func(context.Context, js.Msg) error {
		close(failed)
		w.Agent().StopClaiming() // take no more: the redelivery is the other consumer's
		return errors.New("cannot apply")
	})
	q.publish("1")
	<-failed
	waitRun(t, done)
	_, other := q.consumer()
	ids, deliveries := q.fetchOthers(other, 1, 10*time.Second)
	if len(ids) != 1 || deliveries[0] != 2 {
		t.Fatalf("another consumer got %v (deliveries %v), want message 1 on its second delivery", ids, deliveries)
	}
}

// fetchAll fetches from q's consumer as another worker would, without
// acking, until the returned stop is called; stop returns what it got.
func fetchAll(q *queue) (stop func() []string) {
	_, other := q.consumer()
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan []string, 1)
	go func() {
		var ids []string
		for ctx.Err() == nil {
			b, err := other.Fetch(1, js.FetchMaxWait(500*time.Millisecond))
			if err != nil {
				continue
			}
			for m := range b.Messages() {
				ids = append(ids, string(m.Data()))
			}
		}
		got <- ids
	}()
	return sync.OnceValue(func() []string { cancel(); return <-got })
}

// TestHandoverNothingLostOrTwice: two workers share a consumer; one stops
// claiming midway (its unstarted messages handed back, its started ones
// drained) and the other goes on: every message is applied exactly once.
func TestHandoverNothingLostOrTwice(t *testing.T) {
	const n = 120
	q := newQueue(t, 30*time.Second) // the default AckWait: a stall on it would show as a slow test
	got := newApplied()
	handle := func(_ context.Context, m js.Msg) error {
		time.Sleep(5 * time.Millisecond) // some work
		got.add(string(m.Data()))
		return nil
	}
	leaving := newWorker(t, q, jetstream.Config{Batch: 4, Concurrency: 2})
	staying := newWorker(t, q, jetstream.Config{Batch: 4, Concurrency: 2})
	leftDone := run(t, leaving, handle)
	stayDone := run(t, staying, handle)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	q.publish(ids...)

	eventually(t, "a quarter applied", func() bool { return got.len() >= n/4 })
	a := leaving.Agent()
	a.StopClaiming()
	waitRun(t, leftDone)
	if returned, err := a.Return(q.ctx(), false, 0); err != nil || returned != 0 {
		t.Fatalf("leaving worker's Return: %d, %v; want 0, nil (drained)", returned, err)
	}
	eventually(t, fmt.Sprintf("all %d applied", n), func() bool { return got.len() >= n })
	staying.Agent().StopClaiming()
	waitRun(t, stayDone)

	got.mu.Lock()
	defer got.mu.Unlock()
	for _, id := range ids {
		if c := got.count[id]; c != 1 {
			t.Errorf("message %s applied %d times, want 1", id, c)
		}
	}
	if len(got.order) != n {
		t.Errorf("%d applications, want %d", len(got.order), n)
	}
	if info := q.info(); info.NumAckPending != 0 || info.NumPending != 0 {
		t.Errorf("consumer: ack pending %d, pending %d; want 0, 0", info.NumAckPending, info.NumPending)
	}
}

// TestNewRefuses: bad options and consumers are refused with an error
// naming the field.
func TestNewRefuses(t *testing.T) {
	q := newQueue(t, 3*time.Second)
	nc, c := q.consumer()
	if _, err := q.js.CreateConsumer(q.ctx(), q.stream, js.ConsumerConfig{Durable: "none", AckPolicy: js.AckNonePolicy}); err != nil {
		t.Fatal(err)
	}
	none, err := q.js.Consumer(q.ctx(), q.stream, "none")
	if err != nil {
		t.Fatal(err)
	}
	handBack := func(context.Context, []*worker.Claim) error { return nil }
	returnClaims := func(context.Context) (int, error) { return 0, nil }
	for _, tc := range []struct {
		name string
		opts worker.Options
		cons js.Consumer
		cfg  jetstream.Config
		want string
	}{
		{"HandBack set", worker.Options{HandBack: handBack}, c, jetstream.Config{}, "worker.Options.HandBack"},
		{"ReturnClaims set", worker.Options{ReturnClaims: returnClaims}, c, jetstream.Config{}, "worker.Options.ReturnClaims"},
		{"ack none", worker.Options{}, none, jetstream.Config{}, "AckPolicy"},
		{"keep-alive not below AckWait", worker.Options{}, c, jetstream.Config{KeepAliveInterval: 3 * time.Second}, "Config.KeepAliveInterval"},
		{"batch", worker.Options{}, c, jetstream.Config{Batch: -1}, "Config.Batch"},
		{"concurrency", worker.Options{}, c, jetstream.Config{Concurrency: -1}, "Config.Concurrency"},
		{"max wait", worker.Options{}, c, jetstream.Config{MaxWait: -time.Second}, "Config.MaxWait"},
		{"no token", worker.Options{}, c, jetstream.Config{}, "token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("HANDOFF_TOKEN_FILE", "")
			_, err := jetstream.New(tc.opts, nc, tc.cons, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v; want an error naming %s", err, tc.want)
			}
		})
	}
	w, err := jetstream.New(worker.Options{InsecureNoToken: true}, nc, c, jetstream.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := w.KeepAliveInterval(), time.Second; got != want {
		t.Fatalf("KeepAliveInterval %s, want a third of AckWait, %s", got, want)
	}

	// With BackOff, a redelivery waits its step, maybe shorter than AckWait.
	if _, err := q.js.CreateConsumer(q.ctx(), q.stream, js.ConsumerConfig{Durable: "backoff", AckPolicy: js.AckExplicitPolicy,
		AckWait: 3 * time.Second, BackOff: []time.Duration{3 * time.Second, 1500 * time.Millisecond}, MaxDeliver: 5}); err != nil {
		t.Fatal(err)
	}
	backoff, err := q.js.Consumer(q.ctx(), q.stream, "backoff")
	if err != nil {
		t.Fatal(err)
	}
	w, err = jetstream.New(worker.Options{InsecureNoToken: true}, nc, backoff, jetstream.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := w.KeepAliveInterval(), 500*time.Millisecond; got != want {
		t.Fatalf("KeepAliveInterval with BackOff [3s 1.5s] %s, want a third of the shortest step, %s", got, want)
	}
}

// TestRunRefuses: Run wants a handler, and runs once.
func TestRunRefuses(t *testing.T) {
	q := newQueue(t, hour)
	w := newWorker(t, q, jetstream.Config{})
	if err := w.Run(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "handle is nil") {
		t.Fatalf("Run(nil): %v, want an error naming handle", err)
	}
	done := run(t, w, func(context.Context, js.Msg) error { return nil })
	eventually(t, "the first fetch waiting on the server", func() bool { return q.info().NumWaiting == 1 })
	if err := w.Run(context.Background(), func(context.Context, js.Msg) error { return nil }); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("second Run: %v, want an error", err)
	}
	w.Agent().StopClaiming()
	waitRun(t, done)
}
