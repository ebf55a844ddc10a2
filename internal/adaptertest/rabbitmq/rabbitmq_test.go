package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/handoff-dev/handoff/internal/rabbittest"
	"github.com/handoff-dev/handoff/worker"
	"github.com/handoff-dev/handoff/worker/rabbitmq"
)

func TestMain(m *testing.M) { rabbittest.Run(m) }

// waitBound bounds every wait for something to happen.
const waitBound = 20 * time.Second

// node is one worker under test: an Adapter running, the bodies its
// handler saw, and Run's result.
type node struct {
	a    *rabbitmq.Adapter
	seen chan string
	done chan error
}

// start makes an Adapter on queue and runs it with handle (nil: succeed at
// once). The test ends by stopping its claiming and waiting for Run.
func start(t *testing.T, conn *amqp.Connection, queue string, cfg rabbitmq.Config, handle func(ctx context.Context, d amqp.Delivery) error) *node {
	t.Helper()
	cfg.Queue = queue
	a, err := rabbitmq.New(worker.Options{InsecureNoToken: true}, conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{a: a, seen: make(chan string, 1000), done: make(chan error, 1)}
	go func() {
		n.done <- a.Run(context.Background(), func(ctx context.Context, d amqp.Delivery) error {
			n.seen <- string(d.Body)
			if handle != nil {
				return handle(ctx, d)
			}
			return nil
		})
	}()
	t.Cleanup(func() {
		a.Agent().StopClaiming()
		select {
		case err := <-n.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(waitBound):
			t.Errorf("Run did not return within %s of stop-claiming", waitBound)
		}
	})
	return n
}

// publish publishes bodies to queue.
func publish(t *testing.T, conn *amqp.Connection, queue string, bodies ...string) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ch.Close() }()
	for _, b := range bodies {
		if err := ch.PublishWithContext(context.Background(), "", queue, false, false, amqp.Publishing{Body: []byte(b)}); err != nil {
			t.Fatal(err)
		}
	}
}

// bodies returns "prefix0" … "prefix<n-1>".
func bodies(prefix string, n int) []string {
	b := make([]string, n)
	for i := range b {
		b[i] = fmt.Sprint(prefix, i)
	}
	return b
}

// ready is the number of messages ready in queue (not delivered, or
// requeued).
func ready(t *testing.T, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", waitBound, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func next(t *testing.T, n *node) string {
	t.Helper()
	select {
	case b := <-n.seen:
		return b
	case <-time.After(waitBound):
		t.Fatalf("no delivery handled within %s", waitBound)
		return ""
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	conn := &amqp.Connection{} // never used
	ok := rabbitmq.Config{Queue: "q"}
	for _, tc := range []struct {
		name string
		opts worker.Options
		conn *amqp.Connection
		cfg  func(*rabbitmq.Config)
		want string
	}{
		{"HandBack", worker.Options{HandBack: func(context.Context, []*worker.Claim) error { return nil }}, conn, nil, "worker.Options.HandBack"},
		{"ReturnClaims", worker.Options{ReturnClaims: func(context.Context) (int, error) { return 0, nil }}, conn, nil, "worker.Options.ReturnClaims"},
		{"conn", worker.Options{}, nil, nil, "*amqp.Connection is nil"},
		{"Queue", worker.Options{}, conn, func(c *rabbitmq.Config) { c.Queue = "" }, "Config.Queue"},
		{"Prefetch", worker.Options{}, conn, func(c *rabbitmq.Config) { c.Prefetch = 70000 }, "Config.Prefetch 70000"},
		{"Concurrency", worker.Options{}, conn, func(c *rabbitmq.Config) { c.Concurrency = -1 }, "Config.Concurrency -1"},
		{"token", worker.Options{}, conn, nil, "no token configured"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("HANDOFF_TOKEN_FILE", "")
			cfg := ok
			if tc.cfg != nil {
				tc.cfg(&cfg)
				tc.opts.InsecureNoToken = true
			}
			_, err := rabbitmq.New(tc.opts, tc.conn, cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v; want an error naming %q", err, tc.want)
			}
		})
	}
}

// Stop-claiming cancels the consumer: Run returns, and a message published
// after stays in the queue.
func TestStopClaimingCancelsTheConsumer(t *testing.T) {
	conn := rabbittest.Conn(t)
	queue := rabbittest.Queue(t, conn)
	n := start(t, conn, queue, rabbitmq.Config{}, nil)
	publish(t, conn, queue, "before")
	if got := next(t, n); got != "before" {
		t.Fatalf("handled %q, want before", got)
	}
	n.a.Agent().StopClaiming()
	select {
	case err := <-n.done:
		n.done <- err
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(waitBound):
		t.Fatalf("Run still running %s after stop-claiming", waitBound)
	}
	publish(t, conn, queue, "after")
	eventually(t, "the message published after stop-claiming ready in the queue", func() bool { return ready(t, conn, queue) == 1 })
	if len(n.seen) != 0 {
		t.Fatalf("handled %q after stop-claiming", <-n.seen)
	}
}

// Prefetch 3 with the first delivery being worked: in flight 3, unstarted
// 2. At stop-claiming the 2 are nacked with requeue and another consumer
// gets them at once; the started one drains and is acknowledged. A
// delivery held for a long drain is not redelivered (RabbitMQ has no
// visibility timeout).
func TestDrainCountsAndHandBackToAnotherConsumerAtOnce(t *testing.T) {
	conn := rabbittest.Conn(t)
	queue := rabbittest.Queue(t, conn)
	publish(t, conn, queue, bodies("m", 3)...)
	release := make(chan struct{})
	a := start(t, conn, queue, rabbitmq.Config{Prefetch: 3}, func(context.Context, amqp.Delivery) error { <-release; return nil })
	if got := next(t, a); got != "m0" {
		t.Fatalf("first delivery handled %q, want m0", got)
	}
	agent := a.a.Agent()
	eventually(t, "3 in flight, 2 unstarted", func() bool { return agent.InFlight() == 3 && agent.Unstarted() == 2 })

	agent.StopClaiming()
	eventually(t, "the 2 unstarted handed back", func() bool { return agent.InFlight() == 1 && agent.Unstarted() == 0 })
	b := start(t, conn, queue, rabbitmq.Config{}, nil)
	if got := []string{next(t, b), next(t, b)}; fmt.Sprint(got) != "[m1 m2]" {
		t.Fatalf("b handled %v, want [m1 m2]", got)
	}
	// A long drain: m0 stays a's, b gets nothing more.
	select {
	case got := <-b.seen:
		t.Fatalf("b got %q while a still worked it", got)
	case <-time.After(2 * time.Second):
	}
	close(release)
	if err := <-a.done; err != nil {
		t.Fatalf("a's Run: %v", err)
	}
	a.done <- nil
	if n := ready(t, conn, queue); n != 0 {
		t.Fatalf("%d messages left in the queue, want 0", n)
	}
}

// At the drain deadline ReturnClaims requeues the delivery still worked
// (the handler ignores its context); another consumer gets it at once; the
// handler's late finish does not ack it (which would close a's channel).
func TestReturnClaimsAtTheDeadline(t *testing.T) {
	conn := rabbittest.Conn(t)
	queue := rabbittest.Queue(t, conn)
	publish(t, conn, queue, "m")
	release := make(chan struct{})
	a := start(t, conn, queue, rabbitmq.Config{}, func(context.Context, amqp.Delivery) error { <-release; return nil })
	next(t, a)
	agent := a.a.Agent()
	agent.StopClaiming()
	if n, err := agent.Return(context.Background(), false, 0); err != nil || n != 1 {
		t.Fatalf("Return: %d, %v; want 1", n, err)
	}
	if n, err := agent.Return(context.Background(), false, 0); err != nil || n != 0 {
		t.Fatalf("second Return: %d, %v; want 0", n, err)
	}
	b := start(t, conn, queue, rabbitmq.Config{}, nil)
	if got := next(t, b); got != "m" {
		t.Fatalf("b handled %q, want m", got)
	}
	close(release)
	if err := <-a.done; err != nil {
		t.Fatalf("a's Run: %v", err)
	}
	a.done <- nil
}

// Two workers share a queue; one leaves halfway (stop-claiming, drain,
// return at the deadline) while messages keep coming. Every message is
// handled exactly once and the queue ends empty.
func TestHandoverLosesNothingAndAppliesNothingTwice(t *testing.T) {
	conn := rabbittest.Conn(t)
	queue := rabbittest.Queue(t, conn)
	var mu sync.Mutex
	applied := map[string]int{}
	handle := func(ctx context.Context, d amqp.Delivery) error {
		select {
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		mu.Lock()
		applied[string(d.Body)]++
		mu.Unlock()
		return nil
	}
	cfg := rabbitmq.Config{Prefetch: 5, Concurrency: 2}
	a := start(t, conn, queue, cfg, handle)
	b := start(t, conn, queue, cfg, handle)
	all := bodies("m", 300)
	publish(t, conn, queue, all[:150]...)
	eventually(t, "a worked some", func() bool { return len(a.seen) >= 20 })

	agent := a.a.Agent()
	agent.StopClaiming()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := agent.WaitDrained(ctx); err != nil {
		t.Fatalf("a not drained: %v", err)
	}
	if _, err := agent.Return(ctx, false, 0); err != nil {
		t.Fatal(err)
	}
	publish(t, conn, queue, all[150:]...)

	eventually(t, "every message applied", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(applied) == len(all)
	})
	b.a.Agent().StopClaiming()
	if err := <-b.done; err != nil {
		t.Fatalf("b's Run: %v", err)
	}
	b.done <- nil
	if n := ready(t, conn, queue); n != 0 {
		t.Fatalf("%d messages left in the queue", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, m := range all {
		if applied[m] != 1 {
			t.Errorf("message %s applied %d times, want 1", m, applied[m])
		}
	}
	if len(a.seen) == 0 || len(b.seen) == 0 {
		t.Errorf("a handled %d, b %d: want both some", len(a.seen), len(b.seen))
	}
}

// A handler's error requeues the delivery, which comes again at once.
func TestHandlerErrorRequeues(t *testing.T) {
	conn := rabbittest.Conn(t)
	queue := rabbittest.Queue(t, conn)
	publish(t, conn, queue, "m")
	var mu sync.Mutex
	calls := 0
	a := start(t, conn, queue, rabbitmq.Config{}, func(_ context.Context, d amqp.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			return errors.New("first try fails")
		}
		if !d.Redelivered {
			return errors.New("second delivery not marked redelivered")
		}
		return nil
	})
	if first, second := next(t, a), next(t, a); first != "m" || second != "m" {
		t.Fatalf("handled %q then %q, want m twice", first, second)
	}
	a.a.Agent().StopClaiming()
	if err := <-a.done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	a.done <- nil
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 {
		t.Fatalf("handler called %d times, want 2", calls)
	}
	if n := ready(t, conn, queue); n != 0 {
		t.Fatalf("%d messages left, want 0", n)
	}
}
