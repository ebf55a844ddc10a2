package redisstreams_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/handoff-dev/handoff/internal/redistest"
	"github.com/handoff-dev/handoff/worker"
	"github.com/handoff-dev/handoff/worker/redisstreams"
)

func TestMain(m *testing.M) { redistest.Run(m) }

const group = "g"

// waitBound bounds every wait for something to happen: far longer than it
// takes, far shorter than the timeouts the tests show are not what made it
// happen.
const waitBound = 20 * time.Second

// node is one worker under test: an Adapter running, the entries its
// handler saw, and Run's result.
type node struct {
	a    *redisstreams.Adapter
	seen chan string // the ID of each entry handle is called for
	done chan error  // Run's result
}

// start makes an Adapter for consumer on stream and runs it with handle
// (nil: succeed at once). The test ends by stopping its claiming and waiting
// for Run.
func start(t *testing.T, rdb *redis.Client, stream, consumer string, cfg redisstreams.Config, handle func(ctx context.Context, m redis.XMessage) error) *node {
	t.Helper()
	cfg.Stream, cfg.Group, cfg.Consumer = stream, group, consumer
	a, err := redisstreams.New(worker.Options{InsecureNoToken: true}, rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{a: a, seen: make(chan string, 1000), done: make(chan error, 1)}
	go func() {
		n.done <- a.Run(context.Background(), func(ctx context.Context, m redis.XMessage) error {
			n.seen <- m.ID
			if handle != nil {
				return handle(ctx, m)
			}
			return nil
		})
	}()
	t.Cleanup(func() {
		a.Agent().StopClaiming()
		select {
		case err := <-n.done:
			if err != nil {
				t.Errorf("%s: Run: %v", consumer, err)
			}
		case <-time.After(waitBound):
			t.Errorf("%s: Run did not return within %s of stop-claiming", consumer, waitBound)
		}
	})
	return n
}

// add adds n entries to stream and returns their IDs.
func add(t *testing.T, rdb *redis.Client, stream string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		id, err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []any{"n", i}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	return ids
}

// createGroup creates the group before any worker runs, so that the
// entries added first are read.
func createGroup(t *testing.T, rdb *redis.Client, stream string) {
	t.Helper()
	if err := rdb.XGroupCreateMkStream(context.Background(), stream, group, "0").Err(); err != nil {
		t.Fatal(err)
	}
}

// pending returns the IDs pending on consumer.
func pending(t *testing.T, rdb *redis.Client, stream, consumer string) []string {
	t.Helper()
	ps, err := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{
		Stream: stream, Group: group, Start: "-", End: "+", Count: 1000, Consumer: consumer,
	}).Result()
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(ps))
	for i, p := range ps {
		ids[i] = p.ID
	}
	return ids
}

// eventually polls cond every 10ms until it holds, and fails t if it does
// not within waitBound.
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

// next returns the next entry ID n's handler saw, failing t after
// waitBound.
func next(t *testing.T, n *node) string {
	t.Helper()
	select {
	case id := <-n.seen:
		return id
	case <-time.After(waitBound):
		t.Fatalf("no entry handled within %s", waitBound)
		return ""
	}
}

// blockedReads is the number of clients blocked in XREADGROUP on the
// server.
func blockedReads(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	list, err := rdb.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(list, "\n") {
		if strings.Contains(l, "cmd=xreadgroup") && strings.Contains(l, "flags=b") {
			n++
		}
	}
	return n
}

func TestNewRejectsBadOptions(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer func() { _ = rdb.Close() }()
	ok := redisstreams.Config{Stream: "s", Group: "g", Consumer: "c"}
	for _, tc := range []struct {
		name string
		opts worker.Options
		rdb  *redis.Client
		cfg  func(*redisstreams.Config)
		want string
	}{
		{"HandBack", worker.Options{HandBack: func(context.Context, []*worker.Claim) error { return nil }}, rdb, nil, "worker.Options.HandBack"},
		{"ReturnClaims", worker.Options{ReturnClaims: func(context.Context) (int, error) { return 0, nil }}, rdb, nil, "worker.Options.ReturnClaims"},
		{"client", worker.Options{}, nil, nil, "*redis.Client is nil"},
		{"Stream", worker.Options{}, rdb, func(c *redisstreams.Config) { c.Stream = "" }, "Config.Stream"},
		{"Group", worker.Options{}, rdb, func(c *redisstreams.Config) { c.Group = "" }, "Config.Group"},
		{"Consumer", worker.Options{}, rdb, func(c *redisstreams.Config) { c.Consumer = "" }, "Config.Consumer"},
		{"Consumer returned", worker.Options{}, rdb, func(c *redisstreams.Config) { c.Consumer = redisstreams.DefaultReturnedConsumer }, "Config.ReturnedConsumer"},
		{"VisibilityTimeout", worker.Options{}, rdb, func(c *redisstreams.Config) { c.VisibilityTimeout = time.Millisecond }, "Config.VisibilityTimeout 1ms"},
		{"Block", worker.Options{}, rdb, func(c *redisstreams.Config) { c.Block = -time.Second }, "Config.Block -1s"},
		{"Batch", worker.Options{}, rdb, func(c *redisstreams.Config) { c.Batch = -1 }, "Config.Batch -1"},
		{"Concurrency", worker.Options{}, rdb, func(c *redisstreams.Config) { c.Concurrency = -1 }, "Config.Concurrency -1"},
		{"WakeStream", worker.Options{}, rdb, func(c *redisstreams.Config) { c.WakeStream = c.Stream }, "Config.WakeStream"},
		{"token", worker.Options{}, rdb, nil, "no token configured"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("HANDOFF_TOKEN_FILE", "")
			cfg := ok
			if tc.cfg != nil {
				cfg = ok
				tc.cfg(&cfg)
				tc.opts.InsecureNoToken = true
			}
			_, err := redisstreams.New(tc.opts, tc.rdb, cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v; want an error naming %q", err, tc.want)
			}
		})
	}
}

// Stop-claiming ends a blocking XREADGROUP at once (CLIENT UNBLOCK), with
// no entry taken: Block is an hour, so only the unblock ends Run; an entry
// added after is read by nobody.
func TestStopClaimingEndsTheBlockingReadAndIntake(t *testing.T) {
	rdb, stream := redistest.Client(t), redistest.Key(t)
	n := start(t, rdb, stream, "a", redisstreams.Config{Block: time.Hour}, nil)
	eventually(t, "a claim loop blocked in XREADGROUP", func() bool { return blockedReads(t, rdb) == 1 })

	n.a.Agent().StopClaiming()
	select {
	case err := <-n.done:
		n.done <- err // for the cleanup
		if err != nil {
			t.Fatalf("Run after stop-claiming: %v", err)
		}
	case <-time.After(waitBound):
		t.Fatalf("Run still blocked %s after stop-claiming (Block is 1h)", waitBound)
	}
	if got := blockedReads(t, rdb); got != 0 {
		t.Fatalf("%d reads still blocked after Run returned", got)
	}
	add(t, rdb, stream, 1)
	if p := pending(t, rdb, stream, "a"); len(p) != 0 {
		t.Fatalf("pending on a after stop-claiming: %v", p)
	}
	if len(n.seen) != 0 {
		t.Fatalf("handled %d entries after stop-claiming", len(n.seen))
	}
}

// A batch of 3 with the first being worked: in flight 3, unstarted 2. At
// stop-claiming the 2 are handed back and another consumer, blocked in
// XREADGROUP, takes them at once (its visibility timeout and its Block are
// an hour, so only the hand-back and its wake-up give them to it); the
// started one drains and is acknowledged.
func TestDrainCountsAndHandBackToAnotherConsumerAtOnce(t *testing.T) {
	rdb, stream := redistest.Client(t), redistest.Key(t)
	createGroup(t, rdb, stream)
	ids := add(t, rdb, stream, 3)
	release := make(chan struct{})
	cfg := redisstreams.Config{Batch: 3, VisibilityTimeout: time.Hour, Block: time.Hour}
	a := start(t, rdb, stream, "a", cfg, func(context.Context, redis.XMessage) error {
		<-release
		return nil
	})
	if got := next(t, a); got != ids[0] {
		t.Fatalf("first entry handled %s, want %s", got, ids[0])
	}
	agent := a.a.Agent()
	if in, un := agent.InFlight(), agent.Unstarted(); in != 3 || un != 2 {
		t.Fatalf("while the first of 3 is worked: in flight %d, unstarted %d; want 3, 2", in, un)
	}

	b := start(t, rdb, stream, "b", cfg, nil)
	eventually(t, "b blocked in XREADGROUP", func() bool { return blockedReads(t, rdb) == 1 })

	agent.StopClaiming()
	eventually(t, "the 2 unstarted handed back", func() bool { return agent.InFlight() == 1 && agent.Unstarted() == 0 })
	got := []string{next(t, b), next(t, b)}
	if fmt.Sprint(got) != fmt.Sprint(ids[1:]) {
		t.Fatalf("b handled %v, want %v", got, ids[1:])
	}
	close(release)
	if err := <-a.done; err != nil {
		t.Fatalf("a's Run: %v", err)
	}
	a.done <- nil
	eventually(t, "every entry acknowledged", func() bool {
		return len(pending(t, rdb, stream, "a"))+len(pending(t, rdb, stream, "b")) == 0
	})
	if len(a.seen) != 0 {
		t.Fatalf("a handled more entries after stop-claiming")
	}
}

// At the drain deadline ReturnClaims hands back the entry still worked (the
// handler ignores its context), and another consumer, blocked in
// XREADGROUP for an hour, takes it at once; the entry is then b's.
func TestReturnClaimsAtTheDeadline(t *testing.T) {
	rdb, stream := redistest.Client(t), redistest.Key(t)
	createGroup(t, rdb, stream)
	ids := add(t, rdb, stream, 1)
	release := make(chan struct{})
	defer close(release)
	cfg := redisstreams.Config{VisibilityTimeout: time.Hour, Block: time.Hour}
	a := start(t, rdb, stream, "a", cfg, func(context.Context, redis.XMessage) error { <-release; return nil })
	next(t, a)
	b := start(t, rdb, stream, "b", cfg, func(context.Context, redis.XMessage) error { <-release; return nil })
	eventually(t, "b blocked in XREADGROUP", func() bool { return blockedReads(t, rdb) == 1 })
	a.a.Agent().StopClaiming()
	n, err := a.a.Agent().Return(context.Background(), false, 0)
	if err != nil || n != 1 {
		t.Fatalf("Return: %d, %v; want 1", n, err)
	}
	if n, err := a.a.Agent().Return(context.Background(), false, 0); err != nil || n != 0 {
		t.Fatalf("second Return: %d, %v; want 0", n, err)
	}
	if got := next(t, b); got != ids[0] {
		t.Fatalf("b handled %s, want %s", got, ids[0])
	}
	if got := pending(t, rdb, stream, "b"); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Fatalf("pending on b: %v, want %v", got, ids)
	}
}

// An entry worked for many visibility timeouts, through a drain, is never
// taken by the other consumer autoclaiming with that visibility timeout:
// the keep-alive resets its idle time.
func TestKeepAlivePreventsRedeliveryDuringALongDrain(t *testing.T) {
	rdb, stream := redistest.Client(t), redistest.Key(t)
	createGroup(t, rdb, stream)
	ids := add(t, rdb, stream, 1)
	// The keep-alive runs every third of it: under a loaded CI machine's
	// scheduling, a shorter one was missed by more than its slack.
	const vt = time.Second
	cfg := redisstreams.Config{VisibilityTimeout: vt, Block: 20 * time.Millisecond}
	release := make(chan struct{})
	a := start(t, rdb, stream, "a", cfg, func(context.Context, redis.XMessage) error { <-release; return nil })
	next(t, a)
	a.a.Agent().StopClaiming()
	b := start(t, rdb, stream, "b", cfg, nil)
	// b looks for idle entries every 20ms for 5 visibility timeouts.
	select {
	case id := <-b.seen:
		t.Fatalf("b took %s while a still worked it", id)
	case <-time.After(5 * vt):
	}
	if got := pending(t, rdb, stream, "a"); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Fatalf("pending on a: %v, want %v", got, ids)
	}
	close(release)
	if err := <-a.done; err != nil {
		t.Fatalf("a's Run: %v", err)
	}
	a.done <- nil
	if got := pending(t, rdb, stream, "a"); len(got) != 0 {
		t.Fatalf("pending on a after its work: %v", got)
	}
}

// Two workers share a stream; one leaves halfway (stop-claiming, drain,
// return at the deadline) while entries keep coming. Every entry is
// handled and acknowledged exactly once.
func TestHandoverLosesNothingAndAppliesNothingTwice(t *testing.T) {
	rdb, stream := redistest.Client(t), redistest.Key(t)
	createGroup(t, rdb, stream)
	var mu sync.Mutex
	applied := map[string]int{}
	handle := func(ctx context.Context, m redis.XMessage) error {
		select {
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		mu.Lock()
		applied[m.ID]++
		mu.Unlock()
		return nil
	}
	cfg := redisstreams.Config{Batch: 5, Concurrency: 2, VisibilityTimeout: time.Hour, Block: 50 * time.Millisecond}
	a := start(t, rdb, stream, "a", cfg, handle)
	b := start(t, rdb, stream, "b", cfg, handle)
	ids := add(t, rdb, stream, 150)
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
	ids = append(ids, add(t, rdb, stream, 150)...)

	eventually(t, "every entry applied", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(applied) == len(ids)
	})
	eventually(t, "every entry acknowledged", func() bool {
		return len(pending(t, rdb, stream, "a"))+len(pending(t, rdb, stream, "b"))+
			len(pending(t, rdb, stream, redisstreams.DefaultReturnedConsumer)) == 0
	})
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if applied[id] != 1 {
			t.Errorf("entry %s applied %d times, want 1", id, applied[id])
		}
	}
	if len(a.seen) == 0 || len(b.seen) == 0 {
		t.Errorf("a handled %d, b %d: want both some", len(a.seen), len(b.seen))
	}
}

// A handler's error leaves the entry pending, so it is claimed again once
// idle for the visibility timeout (here by the same worker).
func TestHandlerErrorLeavesTheEntryForRedelivery(t *testing.T) {
	rdb, stream := redistest.Client(t), redistest.Key(t)
	createGroup(t, rdb, stream)
	ids := add(t, rdb, stream, 1)
	var mu sync.Mutex
	calls := 0
	a := start(t, rdb, stream, "a", redisstreams.Config{VisibilityTimeout: 100 * time.Millisecond, Block: 20 * time.Millisecond},
		func(context.Context, redis.XMessage) error {
			mu.Lock()
			defer mu.Unlock()
			calls++
			if calls == 1 {
				return errors.New("first try fails")
			}
			return nil
		})
	if first, second := next(t, a), next(t, a); first != ids[0] || second != ids[0] {
		t.Fatalf("handled %s then %s, want %s twice", first, second, ids[0])
	}
	eventually(t, "acknowledged", func() bool { return len(pending(t, rdb, stream, "a")) == 0 })
}
