package queue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
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
