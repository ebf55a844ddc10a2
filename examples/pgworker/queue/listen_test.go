package queue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
	"github.com/handoff-dev/handoff/internal/faultproxy"
	"github.com/handoff-dev/handoff/internal/pgtest"
)

// notified reports whether op made the queue NOTIFY on VisibleChannel: on
// a connection listening on it, after op a marker notification is sent;
// notifications are delivered in commit order, so op's comes before it.
func notified(t *testing.T, pool *pgxpool.Pool, conn *pgx.Conn, marker string, op func()) bool {
	t.Helper()
	op()
	if _, err := pool.Exec(context.Background(), "SELECT pg_notify($1, $2)", queue.VisibleChannel, marker); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seen := false
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("%s: waiting for the marker notification: %v", marker, err)
		}
		if n.Payload == marker {
			return seen
		}
		seen = true
	}
}

// listening is a connection of its own to pool's database that listens on
// VisibleChannel, closed when t ends.
func listening(t *testing.T, pool *pgxpool.Pool) *pgx.Conn {
	t.Helper()
	conn, err := pgx.ConnectConfig(context.Background(), pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(context.Background(), "LISTEN "+queue.VisibleChannel); err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestVisibleNotifications: the statements that make messages visible at
// once notify; claims, renewals and completions do not.
func TestVisibleNotifications(t *testing.T) {
	ctx := context.Background()
	pool := newQueue(t)
	conn := listening(t, pool)
	var a, b *queue.Claimed
	steps := []struct {
		name string
		op   func()
		want bool
	}{
		{"enqueue", func() {
			enqueue(t, pool, queue.Message{DedupKey: "n1", Amount: 1}, queue.Message{DedupKey: "n2", Amount: 1})
		}, true},
		{"enqueue of a key enqueued before", func() { enqueue(t, pool, queue.Message{DedupKey: "n1", Amount: 1}) }, false},
		{"claim", func() { a, b = claim(t, pool, "w", time.Minute), claim(t, pool, "w", time.Minute) }, false},
		{"renew", func() {
			if _, err := queue.Renew(ctx, pool, "w", a, time.Minute); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"hand back", func() {
			if _, err := queue.HandBack(ctx, pool, "w", []*queue.Claimed{a}); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"complete", func() {
			if _, err := queue.Complete(ctx, pool, "w", b); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"return claims", func() {
			claim(t, pool, "w", time.Minute)
			if _, err := queue.ReturnClaims(ctx, pool, "w"); err != nil {
				t.Fatal(err)
			}
		}, true},
	}
	for _, s := range steps {
		if got := notified(t, pool, conn, s.name, s.op); got != s.want {
			t.Errorf("%s: notified %t, want %t", s.name, got, s.want)
		}
	}
}

// TestListenerWakes: Listen's channel is closed by a notification, and a
// new one is handed out for the next.
func TestListenerWakes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := newQueue(t)
	l := queue.Listen(ctx, pool.Config().ConnConfig, time.Second, testr.New(t))
	// The listener also wakes once when its LISTEN has taken effect: enqueue
	// until a wake-up comes, the connect's or an enqueue's. Either way the
	// connect's is then past.
	visible := l.Visible()
	deadline := time.After(10 * time.Second)
	for i, woke := 0, false; !woke; i++ {
		enqueue(t, pool, queue.Message{DedupKey: fmt.Sprintf("first-%d", i), Amount: 1})
		select {
		case <-visible:
			woke = true
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatal("no wake-up within 10s of enqueues")
		}
	}
	// Now only a notification closes the next channel.
	visible = l.Visible()
	enqueue(t, pool, queue.Message{DedupKey: "second", Amount: 1})
	select {
	case <-visible:
	case <-time.After(10 * time.Second):
		t.Fatal("an enqueue did not wake the listener within 10s")
	}
}

// listeners returns the pids of the backends of pool's database that run a
// LISTEN (the Listener's connection while it waits).
func listeners(t *testing.T, pool *pgxpool.Pool) []int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1 AND pid <> pg_backend_pid()`, queue.ListenerApplicationName)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// waitFor polls cond every 20 ms until it holds, or fails t after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// woken waits up to 10 s for ch to be closed.
func woken(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-time.After(10 * time.Second):
		return false
	}
}

// TestListenerReconnectsAfterItsBackendIsKilled: with its backend
// terminated, the Listener wakes its waiters (a notification may be lost),
// connects again, and an enqueue after that wakes them again.
func TestListenerReconnectsAfterItsBackendIsKilled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := newQueue(t)
	l := queue.Listen(ctx, pool.Config().ConnConfig, 100*time.Millisecond, testr.New(t))
	waitFor(t, "a LISTEN backend", func() bool { return len(listeners(t, pool)) == 1 })
	for round := range 3 {
		old := listeners(t, pool)
		visible := l.Visible()
		// By application_name: the backend's query column shows its last
		// statement, the listener's ping once it has been idle 100 ms, not
		// the LISTEN (matching on the LISTEN missed it under load).
		if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`, queue.ListenerApplicationName); err != nil {
			t.Fatal(err)
		}
		if !woken(visible) {
			t.Fatalf("round %d: the failure of the listener did not wake its waiters", round)
		}
		waitFor(t, "a new LISTEN backend", func() bool {
			now := listeners(t, pool)
			return len(now) == 1 && now[0] != old[0]
		})
		// The connect's own wake-up may come after the backend shows up:
		// enqueue until a wake-up comes, then check the next one comes from
		// an enqueue alone.
		visible = l.Visible()
		for i := 0; ; i++ {
			enqueue(t, pool, queue.Message{DedupKey: fmt.Sprintf("r%d-pre-%d", round, i), Amount: 1})
			select {
			case <-visible:
			case <-time.After(200 * time.Millisecond):
				if i > 50 {
					t.Fatalf("round %d: no wake-up after the reconnect", round)
				}
				continue
			}
			break
		}
		visible = l.Visible()
		enqueue(t, pool, queue.Message{DedupKey: fmt.Sprintf("r%d", round), Amount: 1})
		if !woken(visible) {
			t.Fatalf("round %d: an enqueue after the reconnect did not wake the listener", round)
		}
	}
}

// listenGoroutines counts the goroutines running Listen's loop.
func listenGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "queue.Listen.func1")
}

// TestListenerEndsWithItsContext: when ctx ends, Listen's goroutine ends
// and its connection is closed, whether it was waiting for a notification
// or for its retry after a failure.
func TestListenerEndsWithItsContext(t *testing.T) {
	pool := newQueue(t)
	before := listenGoroutines()

	ctx, cancel := context.WithCancel(context.Background())
	queue.Listen(ctx, pool.Config().ConnConfig, time.Second, testr.New(t))
	waitFor(t, "a LISTEN backend", func() bool { return len(listeners(t, pool)) == 1 })
	cancel()
	waitFor(t, "the LISTEN backend gone", func() bool { return len(listeners(t, pool)) == 0 })
	waitFor(t, "Listen's goroutine ended", func() bool { return listenGoroutines() == before })

	// Cancelled while it waits to retry (the database refuses it).
	cfg := pool.Config().ConnConfig.Copy()
	cfg.Database = "no_such_database"
	ctx, cancel = context.WithCancel(context.Background())
	queue.Listen(ctx, cfg, time.Hour, testr.New(t))
	waitFor(t, "Listen's goroutine started", func() bool { return listenGoroutines() == before+1 })
	cancel()
	waitFor(t, "Listen's goroutine ended in its retry wait", func() bool { return listenGoroutines() == before })
}

// oldSchema turns pool's database into one migrated by the schema before
// the visible-message triggers.
func oldSchema(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
DROP TRIGGER handoff_queue_visible_insert ON handoff_queue;
DROP TRIGGER handoff_queue_visible_update ON handoff_queue;
DROP FUNCTION handoff_queue_notify_visible()`)
	if err != nil {
		t.Fatal(err)
	}
}

// migrateAtOnce runs n Migrates at once on pool.
func migrateAtOnce(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = queue.Migrate(context.Background(), pool)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("migrate %d: %v", i, err)
		}
	}
}

// TestConcurrentMigrates: Migrates at once succeed on a new database, on one
// already migrated, and on one of the schema without the triggers; after
// them, an enqueue notifies once.
func TestConcurrentMigrates(t *testing.T) {
	for _, tc := range []string{"new", "migrated", "old schema"} {
		t.Run(tc, func(t *testing.T) {
			pool, err := pgxpool.New(context.Background(), pgtest.Database(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			switch tc {
			case "migrated":
				if err := queue.Migrate(context.Background(), pool); err != nil {
					t.Fatal(err)
				}
			case "old schema":
				if err := queue.Migrate(context.Background(), pool); err != nil {
					t.Fatal(err)
				}
				oldSchema(t, pool)
			}
			migrateAtOnce(t, pool, 4)
			var triggers int
			if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'handoff_queue'::regclass AND NOT tgisinternal`).Scan(&triggers); err != nil {
				t.Fatal(err)
			}
			if triggers != 2 {
				t.Errorf("handoff_queue has %d triggers, want 2", triggers)
			}
			conn := listening(t, pool)
			if !notified(t, pool, conn, "enqueue", func() { enqueue(t, pool, queue.Message{DedupKey: "m", Amount: 1}) }) {
				t.Error("an enqueue after the migrations did not notify")
			}
		})
	}
}

// TestClaimsNeverNotify: no claim notifies: of a shard, a batch, or of a
// message whose visibility timeout ran out (claimed again by another
// worker).
func TestClaimsNeverNotify(t *testing.T) {
	ctx := context.Background()
	pool := newQueue(t)
	conn := listening(t, pool)
	// The enqueue's notification is read before the claims.
	notified(t, pool, conn, "enqueue", func() {
		enqueue(t, pool,
			queue.Message{DedupKey: "a", Amount: 1}, queue.Message{DedupKey: "b", Amount: 1},
			queue.Message{DedupKey: "s1", Amount: 1, Shard: "s"}, queue.Message{DedupKey: "s2", Amount: 1, Shard: "s"})
	})
	steps := []struct {
		name string
		op   func()
	}{
		{"claim batch", func() {
			if _, err := queue.ClaimBatch(ctx, pool, "w1", time.Millisecond, 2); err != nil {
				t.Fatal(err)
			}
		}},
		{"claim of expired claims", func() {
			time.Sleep(5 * time.Millisecond)
			cs, err := queue.ClaimBatch(ctx, pool, "w2", time.Minute, 2)
			if err != nil || len(cs) != 2 {
				t.Fatalf("claimed %d expired claims, %v; want 2", len(cs), err)
			}
		}},
		{"claim of a shard", func() {
			cs, err := queue.ClaimShard(ctx, pool, "w1", "s", time.Minute, 2)
			if err != nil || len(cs) != 2 {
				t.Fatalf("claimed %d of the shard, %v; want 2", len(cs), err)
			}
		}},
		{"claim of nothing", func() {
			if _, err := queue.ClaimBatch(ctx, pool, "w1", time.Minute, 2); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, s := range steps {
		if notified(t, pool, conn, s.name, s.op) {
			t.Errorf("%s notified", s.name)
		}
	}
}

// BenchmarkEnqueue10k: one Enqueue of 10,000 messages (and, with claim,
// one ClaimBatch of them all), with the triggers (Migrate's schema) and
// without them: their cost on a large enqueue and a large claim.
func BenchmarkEnqueue10k(b *testing.B) {
	for _, tc := range []struct{ triggers, claim bool }{{true, false}, {false, false}, {true, true}, {false, true}} {
		triggers := tc.triggers
		b.Run(fmt.Sprintf("triggers=%t/claim=%t", tc.triggers, tc.claim), func(b *testing.B) {
			pool, err := pgxpool.New(context.Background(), pgtest.Database(b))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(pool.Close)
			if err := queue.Migrate(context.Background(), pool); err != nil {
				b.Fatal(err)
			}
			if !triggers {
				_, err := pool.Exec(context.Background(), `
DROP TRIGGER handoff_queue_visible_insert ON handoff_queue;
DROP TRIGGER handoff_queue_visible_update ON handoff_queue`)
				if err != nil {
					b.Fatal(err)
				}
			}
			msgs := make([]queue.Message, 10000)
			for i := 0; b.Loop(); i++ {
				for j := range msgs {
					msgs[j] = queue.Message{DedupKey: fmt.Sprintf("%d-%d", i, j), Amount: 1}
				}
				if err := queue.Enqueue(context.Background(), pool, msgs); err != nil {
					b.Fatal(err)
				}
				if !tc.claim {
					continue
				}
				// The claims of them all: the update trigger's share.
				if _, err := queue.ClaimBatch(context.Background(), pool, "w", time.Minute, 10000); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestListenerNoticesASilentConnection: when its connection goes silent
// (no answer, no reset: a network partition), the Listener notices within
// a few retry periods, wakes its waiters and connects again once the
// server answers, rather than wait for notifications that cannot come
// until TCP keepalive gives up, many minutes later.
func TestListenerNoticesASilentConnection(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := newQueue(t)
	cfg := pool.Config().ConnConfig.Copy()
	proxy := faultproxy.New(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	host, port, err := net.SplitHostPort(proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port = host, uint16(p)
	l := queue.Listen(ctx, cfg, 200*time.Millisecond, testr.New(t))
	waitFor(t, "a LISTEN backend", func() bool { return len(listeners(t, pool)) == 1 })
	// Past the connect's wake-up: an enqueue's comes.
	visible := l.Visible()
	for i := 0; ; i++ {
		enqueue(t, pool, queue.Message{DedupKey: fmt.Sprintf("pre-%d", i), Amount: 1})
		select {
		case <-visible:
		case <-time.After(200 * time.Millisecond):
			if i > 50 {
				t.Fatal("no wake-up from enqueues")
			}
			continue
		}
		break
	}
	visible = l.Visible()
	if err := proxy.Hang(); err != nil {
		t.Fatal(err)
	}
	if err := proxy.Latency(time.Hour); err != nil {
		t.Fatal(err)
	}
	enqueue(t, pool, queue.Message{DedupKey: "lost", Amount: 1})
	if !woken(visible) {
		t.Fatal("the Listener did not notice within 10s that its connection went silent (its waiters were not woken)")
	}
	if err := proxy.Restore(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a wake-up by an enqueue after the server answers again", func() bool {
		visible := l.Visible()
		enqueue(t, pool, queue.Message{DedupKey: fmt.Sprintf("after-%d", time.Now().UnixNano()), Amount: 1})
		select {
		case <-visible:
			return true
		case <-time.After(200 * time.Millisecond):
			return false
		}
	})
}

// TestListenRefusesANonPositiveRetry: a retry of 0 would spin (connect or
// ping without a pause); Listen panics with a message naming it.
func TestListenRefusesANonPositiveRetry(t *testing.T) {
	defer func() {
		r := recover()
		if msg, _ := r.(string); !strings.Contains(msg, "retry must be positive") {
			t.Fatalf("Listen with retry 0: recovered %v, want a panic naming retry", r)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, err := pgx.ParseConfig("postgres://127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	queue.Listen(ctx, cfg, 0, testr.New(t))
}
