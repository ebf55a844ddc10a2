package queue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"math/rand/v2"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
	"github.com/handoff-dev/handoff/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Run(m) }

// newQueue returns a pool on a fresh, migrated database.
func newQueue(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := queue.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

func enqueue(t *testing.T, pool *pgxpool.Pool, msgs ...queue.Message) {
	t.Helper()
	if err := queue.Enqueue(context.Background(), pool, msgs); err != nil {
		t.Fatal(err)
	}
}

func claim(t *testing.T, pool *pgxpool.Pool, worker string, visibility time.Duration) *queue.Claimed {
	t.Helper()
	c, err := queue.Claim(context.Background(), pool, worker, visibility)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func check(t *testing.T, pool *pgxpool.Pool) queue.Report {
	t.Helper()
	r, err := queue.Check(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// count returns the number of rows of handoff_deliveries with outcome.
func count(t *testing.T, pool *pgxpool.Pool, outcome string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT count(*) FROM handoff_deliveries WHERE outcome = $1`, outcome).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestMigrateTwiceAndConcurrently(t *testing.T) {
	t.Parallel()
	pool := newQueue(t) // migrated once
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() { errs <- queue.Migrate(context.Background(), pool) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if r := check(t, pool); r != (queue.Report{}) {
		t.Fatalf("empty queue: got %v, want all zero", r)
	}
}

func TestEnqueueSkipsKnownKeys(t *testing.T) {
	t.Parallel()
	pool := newQueue(t)
	enqueue(t, pool, queue.Message{DedupKey: "a", Amount: 1}, queue.Message{DedupKey: "b", Amount: 2}, queue.Message{DedupKey: "a", Amount: 100})
	enqueue(t, pool, queue.Message{DedupKey: "b", Amount: 200}, queue.Message{DedupKey: "c", Amount: 3, WorkMillis: 7})
	r := check(t, pool)
	if r.Enqueued != 3 || r.Pending != 3 || r.WantTotal != 6 {
		t.Fatalf("got %v, want 3 enqueued and pending, want total 6", r)
	}
	// Claims come in enqueue order.
	for _, want := range []queue.Message{{DedupKey: "a", Amount: 1}, {DedupKey: "b", Amount: 2}, {DedupKey: "c", Amount: 3, WorkMillis: 7}} {
		c := claim(t, pool, "w", time.Hour)
		if c == nil || c.Message != want || c.Deliveries != 1 {
			t.Fatalf("claim: got %+v, want %+v on first delivery", c, want)
		}
	}
}

func TestVisibilityTimeoutExpiryMakesMessageReclaimable(t *testing.T) {
	t.Parallel()
	pool := newQueue(t)
	enqueue(t, pool, queue.Message{DedupKey: "k", Amount: 5})

	first := claim(t, pool, "w1", 300*time.Millisecond)
	if first == nil {
		t.Fatal("claim: got nothing, want the message")
	}
	if first.Deliveries != 1 || first.VisibleAt.IsZero() {
		t.Fatalf("claim: got %+v, want first delivery with a visibility deadline", first)
	}
	if c := claim(t, pool, "w2", time.Minute); c != nil {
		t.Fatalf("claim while hidden: got %+v, want nothing", c)
	}

	time.Sleep(time.Until(first.VisibleAt) + 50*time.Millisecond)
	second := claim(t, pool, "w2", time.Minute)
	if second == nil || second.ID != first.ID || second.Deliveries != 2 {
		t.Fatalf("claim after expiry: got %+v, want message %d on its second delivery", second, first.ID)
	}
	if r := check(t, pool); r.Redeliveries != 1 {
		t.Fatalf("got %v, want 1 redelivery", r)
	}
}

func TestSkipLockedGivesConcurrentClaimersDifferentMessages(t *testing.T) {
	t.Parallel()
	pool := newQueue(t)
	ctx := context.Background()
	enqueue(t, pool, queue.Message{DedupKey: "1", Amount: 1}, queue.Message{DedupKey: "2", Amount: 1})

	// A claimer in the middle of its claim holds the first row locked; the
	// next claimer must take the second message at once, not wait.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var locked int64
	if err := tx.QueryRow(ctx, `SELECT id FROM handoff_queue ORDER BY id LIMIT 1 FOR UPDATE`).Scan(&locked); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := queue.Claim(cctx, pool, "w", time.Minute)
	if err != nil {
		t.Fatalf("claim next to a locked row: %v", err)
	}
	if c == nil || c.ID == locked || c.DedupKey != "2" {
		t.Fatalf("claim next to locked message %d: got %+v, want message 2", locked, c)
	}
}

func TestConcurrentClaimersNeverShareAMessage(t *testing.T) {
	t.Parallel()
	pool := newQueue(t)
	const messages, workers = 60, 6
	var msgs []queue.Message
	for i := range messages {
		msgs = append(msgs, queue.Message{DedupKey: fmt.Sprint(i), Amount: int64(i)})
	}
	enqueue(t, pool, msgs...)

	var mu sync.Mutex
	seen := map[int64]string{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		name := fmt.Sprintf("w%d", w)
		wg.Go(func() {
			for {
				c, err := queue.Claim(context.Background(), pool, name, time.Hour)
				if err != nil || c == nil {
					errs <- err
					return
				}
				mu.Lock()
				if other, ok := seen[c.ID]; ok {
					mu.Unlock()
					errs <- fmt.Errorf("message %d claimed by %s and %s", c.ID, other, name)
					return
				}
				seen[c.ID] = name
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(seen) != messages {
		t.Fatalf("claimed %d distinct messages, want %d", len(seen), messages)
	}
}

func TestCompleteTwiceAppliesOnce(t *testing.T) {
	t.Parallel()
	pool := newQueue(t)
	ctx := context.Background()
	enqueue(t, pool, queue.Message{DedupKey: "pay-1", Amount: 40}, queue.Message{DedupKey: "pay-2", Amount: 2})

	c := claim(t, pool, "w1", time.Minute)
	applied, err := queue.Complete(ctx, pool, "w1", c)
	if err != nil || !applied {
		t.Fatalf("first Complete: got applied=%v, %v; want applied", applied, err)
	}
	applied, err = queue.Complete(ctx, pool, "w1", c)
	if err != nil || applied {
		t.Fatalf("second Complete: got applied=%v, %v; want a duplicate", applied, err)
	}
	r := check(t, pool)
	if r.Total != 40 || r.Applied != 1 || r.Pending != 1 || r.Duplicates != 1 {
		t.Fatalf("got %v, want total 40, 1 applied, 1 pending, 1 duplicate", r)
	}
	if err := r.Err(); err != nil {
		t.Fatalf("Report.Err: %v", err)
	}
	if n := count(t, pool, queue.OutcomeDuplicate); n != 1 {
		t.Fatalf("%d duplicate deliveries recorded, want 1", n)
	}
}

func TestRedeliveryAfterExpiryAppliesOnce(t *testing.T) {
	t.Parallel()
	pool := newQueue(t)
	ctx := context.Background()
	enqueue(t, pool, queue.Message{DedupKey: "k", Amount: 7})

	// w1's claim runs out while it works; w2 gets the message; both finish.
	slow := claim(t, pool, "w1", 100*time.Millisecond)
	time.Sleep(time.Until(slow.VisibleAt) + 50*time.Millisecond)
	fast := claim(t, pool, "w2", time.Minute)
	if fast == nil || fast.ID != slow.ID {
		t.Fatalf("claim after expiry: got %+v, want message %d", fast, slow.ID)
	}
	a1, err1 := queue.Complete(ctx, pool, "w1", slow)
	a2, err2 := queue.Complete(ctx, pool, "w2", fast)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if !a1 || a2 {
		t.Fatalf("applied: w1 %v, w2 %v; want w1 applied and w2 a duplicate", a1, a2)
	}
	r := check(t, pool)
	if err := r.Err(); err != nil {
		t.Fatalf("Report.Err: %v", err)
	}
	want := queue.Report{Enqueued: 1, Applied: 1, Duplicates: 1, Redeliveries: 1, Total: 7, WantTotal: 7}
	if r != want {
		t.Fatalf("got %v\nwant %v", r, want)
	}
}

func TestReturnClaimsMakesClaimsVisibleAtOnce(t *testing.T) {
	t.Parallel()
	pool := newQueue(t)
	ctx := context.Background()
	enqueue(t, pool, queue.Message{DedupKey: "a", Amount: 1}, queue.Message{DedupKey: "b", Amount: 1}, queue.Message{DedupKey: "c", Amount: 1})

	a1, a2 := claim(t, pool, "a", time.Hour), claim(t, pool, "a", time.Hour)
	b1 := claim(t, pool, "b", time.Hour)
	if a1 == nil || a2 == nil || b1 == nil {
		t.Fatal("want three claims")
	}
	if c := claim(t, pool, "c", time.Hour); c != nil {
		t.Fatalf("claim with all claimed: got %+v, want nothing", c)
	}

	n, err := queue.ReturnClaims(ctx, pool, "a")
	if err != nil || n != 2 {
		t.Fatalf("ReturnClaims(a): got %d, %v; want 2", n, err)
	}
	got := map[int64]bool{}
	for range 2 {
		c := claim(t, pool, "c", time.Hour)
		if c == nil {
			t.Fatal("claim after return: got nothing, want a returned message")
		}
		got[c.ID] = true
	}
	if !got[a1.ID] || !got[a2.ID] {
		t.Fatalf("claimed %v after return, want %d and %d", got, a1.ID, a2.ID)
	}
	if c := claim(t, pool, "c", time.Hour); c != nil {
		t.Fatalf("b's claim must stay: got %+v", c)
	}
	if n := count(t, pool, queue.OutcomeReturned); n != 2 {
		t.Fatalf("%d returned deliveries recorded, want 2", n)
	}
	// Nothing left to return: calling again is harmless.
	if n, err := queue.ReturnClaims(ctx, pool, "a"); err != nil || n != 0 {
		t.Fatalf("second ReturnClaims(a): got %d, %v; want 0", n, err)
	}
}

func TestLeaderJobRefusesStaleFencingToken(t *testing.T) {
	t.Parallel()
	pool := newQueue(t)
	ctx := context.Background()

	for _, run := range []struct {
		token  int64
		holder string
		stale  bool
	}{
		{1, "pod-a", false},
		{1, "pod-a", false}, // same term again
		{2, "pod-b", false},
		{1, "pod-a", true}, // old leader, after pod-b took over
		{3, "pod-a", false},
	} {
		err := queue.RunLeaderJob(ctx, pool, "jobs", run.token, run.holder)
		if got := errors.Is(err, queue.ErrStaleFencingToken); got != run.stale || (err != nil && !run.stale) {
			t.Fatalf("RunLeaderJob(token %d, %s): got %v, want stale=%v", run.token, run.holder, err, run.stale)
		}
	}
	// Fencing is per Lease.
	if err := queue.RunLeaderJob(ctx, pool, "other", 1, "pod-c"); err != nil {
		t.Fatalf("RunLeaderJob on another Lease: %v", err)
	}
	r := check(t, pool)
	if r.LeaderRuns != 5 || r.StaleLeaderRuns != 0 {
		t.Fatalf("got %v, want 5 leader runs, none stale", r)
	}

	// The term's end is recorded with the run when given.
	until := time.Now().Add(10 * time.Second).Round(time.Microsecond)
	if err := queue.RunLeaderJobUntil(ctx, pool, "jobs", 3, "pod-a", until); err != nil {
		t.Fatal(err)
	}
	var got *time.Time
	if err := pool.QueryRow(ctx, `SELECT until_at FROM handoff_leader_runs ORDER BY id DESC LIMIT 1`).Scan(&got); err != nil || got == nil || !got.Equal(until) {
		t.Fatalf("until_at = %v, %v; want %s", got, err, until)
	}
	if err := pool.QueryRow(ctx, `SELECT until_at FROM handoff_leader_runs WHERE lease = 'other'`).Scan(&got); err != nil || got != nil {
		t.Fatalf("RunLeaderJob's until_at = %v, %v; want NULL", got, err)
	}

	// A run that bypassed the fence shows up in the report.
	if _, err := pool.Exec(ctx, `INSERT INTO handoff_leader_runs (lease, token, holder) VALUES ('jobs', 2, 'pod-b')`); err != nil {
		t.Fatal(err)
	}
	r = check(t, pool)
	if r.StaleLeaderRuns != 1 || r.Err() == nil || !strings.Contains(r.Err().Error(), "stale leader runs") {
		t.Fatalf("got %v, Err %v; want 1 stale leader run reported", r, r.Err())
	}
}

func TestCheckFindsLostMessagesAndDoubleEffects(t *testing.T) {
	t.Parallel()
	pool := newQueue(t)
	ctx := context.Background()
	enqueue(t, pool, queue.Message{DedupKey: "a", Amount: 10}, queue.Message{DedupKey: "b", Amount: 20})

	if _, err := pool.Exec(ctx, `DELETE FROM handoff_queue WHERE dedup_key = 'a'`); err != nil {
		t.Fatal(err)
	}
	err := check(t, pool).Err()
	if err == nil || !strings.Contains(err.Error(), "lost messages") {
		t.Fatalf("after losing a message: Err %v, want lost messages", err)
	}

	c := claim(t, pool, "w", time.Minute)
	if _, err := queue.Complete(ctx, pool, "w", c); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE handoff_totals SET total = total + 20`); err != nil {
		t.Fatal(err)
	}
	err = check(t, pool).Err()
	if err == nil || !strings.Contains(err.Error(), "double effects") {
		t.Fatalf("after applying twice: Err %v, want double effects", err)
	}
}

func TestReportErr(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    queue.Report
		want []string // substrings of Err; none: Err is nil
	}{
		{"empty", queue.Report{}, nil},
		{"all applied", queue.Report{Enqueued: 2, Applied: 2, Total: 5, WantTotal: 5}, nil},
		{"some pending", queue.Report{Enqueued: 2, Applied: 1, Pending: 1, Total: 2, WantTotal: 5, PendingTotal: 3}, nil},
		{"lost", queue.Report{Enqueued: 2, Applied: 1, Total: 2, WantTotal: 5}, []string{"lost messages", "missing effects"}},
		{"double", queue.Report{Enqueued: 1, Applied: 1, Total: 10, WantTotal: 5}, []string{"double effects"}},
		{"stale", queue.Report{LeaderRuns: 3, StaleLeaderRuns: 1}, []string{"stale leader runs"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.r.Err()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Err: %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Err: nil, want %q", tc.want)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Err: %v, want it to mention %q", err, s)
				}
			}
		})
	}
}

// ClaimBatch claims up to n messages in one statement, longest waiting
// first: a message whose claim expired waits from its expiry, behind those
// waiting since their enqueue. HandBack makes them claimable at once,
// except a message claimed again since (here by the same worker after its
// visibility timeout, a later delivery) or completed: the hand-back is
// fenced by the delivery.
func TestClaimBatchAndFencedHandBack(t *testing.T) {
	t.Parallel()
	pool := newQueue(t)
	ctx := context.Background()
	enqueue(t, pool, queue.Message{DedupKey: "a", Amount: 1}, queue.Message{DedupKey: "b", Amount: 2},
		queue.Message{DedupKey: "c", Amount: 4}, queue.Message{DedupKey: "d", Amount: 8})
	if _, err := queue.ClaimBatch(ctx, pool, "w1", time.Minute, 0); err == nil {
		t.Fatal("ClaimBatch(n=0) = nil error, want one naming the batch size")
	}
	// a expires at once (1µs), the others are hidden for an hour.
	first, err := queue.ClaimBatch(ctx, pool, "w1", time.Microsecond, 1)
	if err != nil || len(first) != 1 || first[0].DedupKey != "a" {
		t.Fatalf("ClaimBatch(1) = %+v, %v: want message a", first, err)
	}
	batch, err := queue.ClaimBatch(ctx, pool, "w1", time.Hour, 4)
	if err != nil || len(batch) != 4 {
		t.Fatalf("ClaimBatch(4) = %d claims, %v: want 4", len(batch), err)
	}
	// a is in this batch again on its second delivery, last: it waited
	// from its first claim's expiry, b, c and d from their enqueue. The
	// first claim of a is stale.
	var keys []string
	for _, c := range batch {
		keys = append(keys, c.DedupKey)
	}
	if strings.Join(keys, ",") != "b,c,d,a" || batch[3].Deliveries != 2 {
		t.Fatalf("batch = %v (a's delivery %d): want b, c, d, then a (second delivery) longest waiting first", keys, batch[3].Deliveries)
	}
	if _, err := queue.Complete(ctx, pool, "w1", batch[1]); err != nil { // c: done
		t.Fatal(err)
	}
	// Hand back the stale claim of a, b and the completed c: only b moves.
	n, err := queue.HandBack(ctx, pool, "w1", []*queue.Claimed{first[0], batch[0], batch[1]})
	if err != nil || n != 1 {
		t.Fatalf("HandBack = %d, %v: want 1 (b; a was claimed again since, c is completed)", n, err)
	}
	got := claim(t, pool, "w2", time.Hour)
	if got == nil || got.DedupKey != "b" {
		t.Fatalf("claim after the hand-back = %+v: want b, claimable at once", got)
	}
	if c := claim(t, pool, "w2", time.Hour); c != nil {
		t.Fatalf("next claim = %+v: want none (a and d still w1's)", c)
	}
	if r := check(t, pool); r.Err() != nil || r.Applied != 1 || r.Pending != 3 {
		t.Fatalf("check = %v (%v): want c applied, a, b, d pending", r, r.Err())
	}
	if n := count(t, pool, queue.OutcomeHandedBack); n != 1 {
		t.Fatalf("%d handed-back deliveries recorded, want 1", n)
	}
}

func TestRenewIsFencedByTheDelivery(t *testing.T) {
	t.Parallel()
	pool := newQueue(t)
	ctx := context.Background()
	enqueue(t, pool, queue.Message{DedupKey: "a", Amount: 1}, queue.Message{DedupKey: "b", Amount: 2})
	batch, err := queue.ClaimBatch(ctx, pool, "w1", time.Microsecond, 2) // both expire at once
	if err != nil || len(batch) != 2 {
		t.Fatalf("ClaimBatch = %d claims, %v: want 2", len(batch), err)
	}
	// a: expired, not claimed by anyone since: still w1's to renew.
	if ok, err := queue.Renew(ctx, pool, "w1", batch[0], time.Hour); err != nil || !ok {
		t.Fatalf("Renew(a, expired and unclaimed) = %v, %v: want true", ok, err)
	}
	// b: claimed by w2 after its timeout: no longer w1's.
	if c := claim(t, pool, "w2", time.Hour); c == nil || c.DedupKey != "b" {
		t.Fatalf("w2 claimed %+v: want b (a is hidden again by the renewal)", c)
	}
	if ok, err := queue.Renew(ctx, pool, "w1", batch[1], time.Hour); err != nil || ok {
		t.Fatalf("Renew(b, claimed by w2 since) = %v, %v: want false", ok, err)
	}
	if ok, err := queue.Renew(ctx, pool, "w2", batch[1], time.Hour); err != nil || ok {
		t.Fatalf("Renew by w2 of w1's delivery of b = %v, %v: want false (w2's delivery is a later one)", ok, err)
	}
	if _, err := queue.Complete(ctx, pool, "w1", batch[0]); err != nil {
		t.Fatal(err)
	}
	if ok, err := queue.Renew(ctx, pool, "w1", batch[0], time.Hour); err != nil || ok {
		t.Fatalf("Renew(a, completed) = %v, %v: want false", ok, err)
	}
}

// A claim takes no more than its batch, whatever plan the planner picks.
// With hashing, sorts, merge joins and materialization off, the planner
// joins the update to its pick of rows with a nested loop semi join, as it
// did in an e2e run once the table's statistics had grown: a pick written
// as a subquery then ran once per row of the table, skipped the rows the
// statement had just claimed, and a claim of a batch of 1 took all 8
// messages (the other worker got none).
func TestClaimTakesNoMoreThanItsBatch(t *testing.T) {
	t.Parallel()
	pool := newQueue(t)
	ctx := context.Background()
	for i := range 8 {
		enqueue(t, pool, queue.Message{DedupKey: fmt.Sprint(i), Amount: 1})
	}
	cfg := pool.Config().Copy()
	for _, p := range []string{"enable_hashagg", "enable_sort", "enable_hashjoin", "enable_mergejoin", "enable_material"} {
		cfg.ConnConfig.RuntimeParams[p] = "off"
	}
	nested, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nested.Close)
	for _, batch := range []int{1, 3} {
		cs, err := queue.ClaimBatch(ctx, nested, "w", time.Minute, batch)
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) != batch {
			t.Errorf("a claim of a batch of %d took %d messages", batch, len(cs))
		}
	}
}

// nestedPool is a pool on pool's database whose planner prefers nested
// loops (as TestClaimTakesNoMoreThanItsBatch forces them).
func nestedPool(t *testing.T, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config().Copy()
	for _, p := range []string{"enable_hashagg", "enable_sort", "enable_hashjoin", "enable_mergejoin", "enable_material"} {
		cfg.ConnConfig.RuntimeParams[p] = "off"
	}
	nested, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nested.Close)
	return nested
}

type claimRec struct {
	worker  string
	c       *queue.Claimed
	batch   int
	claimed time.Time // the claiming statement's now(): VisibleAt less the visibility
}

// Concurrent claimers of batches of 1 to 8, on pools with and without
// nested-loop plans, of no shard and of two shards, with a visibility
// short enough that messages come back: no claim takes more than its
// batch or a message of another shard, no message is claimed again while
// a claim of it is still visible to nobody else, and every message is
// claimed (none skipped for ever).
func TestConcurrentBatchClaimsNeverOverlapOrSkip(t *testing.T) {
	for _, vis := range []time.Duration{time.Hour, 30 * time.Millisecond} {
		t.Run(vis.String(), func(t *testing.T) {
			pool := newQueue(t)
			nested := nestedPool(t, pool)
			shards := []string{"", "s-0", "s-1"}
			const perShard = 150
			var msgs []queue.Message
			for _, s := range shards {
				for i := range perShard {
					msgs = append(msgs, queue.Message{DedupKey: fmt.Sprintf("%s/%d", s, i), Amount: 1, Shard: s})
				}
			}
			enqueue(t, pool, msgs...)
			var mu sync.Mutex
			var recs []claimRec
			var wg sync.WaitGroup
			deadline := time.Now().Add(4 * time.Second)
			errs := make(chan error, 64)
			for w := range 12 {
				name := fmt.Sprintf("w%d", w)
				p := pool
				if w%2 == 1 {
					p = nested
				}
				shard := shards[w%3]
				wg.Go(func() {
					empty := 0
					for time.Now().Before(deadline) {
						n := 1 + rand.IntN(8)
						var cs []*queue.Claimed
						var err error
						if shard == "" {
							cs, err = queue.ClaimBatch(context.Background(), p, name, vis, n)
						} else {
							cs, err = queue.ClaimShard(context.Background(), p, name, shard, vis, n)
						}
						if err != nil {
							errs <- err
							return
						}
						if len(cs) > n {
							errs <- fmt.Errorf("%s: a claim of a batch of %d took %d", name, n, len(cs))
						}
						mu.Lock()
						for _, c := range cs {
							if c.Shard != shard {
								errs <- fmt.Errorf("%s: a claim of shard %q took message %d of shard %q", name, shard, c.ID, c.Shard)
							}
							recs = append(recs, claimRec{worker: name, c: c, batch: n, claimed: c.VisibleAt.Add(-vis)})
						}
						mu.Unlock()
						if len(cs) == 0 {
							empty++
							if vis == time.Hour && empty > 20 {
								return
							}
							time.Sleep(time.Millisecond)
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			byID := map[int64][]claimRec{}
			for _, r := range recs {
				byID[r.c.ID] = append(byID[r.c.ID], r)
			}
			if len(byID) != len(msgs) {
				t.Errorf("%d distinct messages claimed, want %d", len(byID), len(msgs))
			}
			overlaps := 0
			for id, rs := range byID {
				for i := range rs {
					for j := range rs {
						if i == j {
							continue
						}
						a, b := rs[i], rs[j]
						if a.c.Deliveries == b.c.Deliveries {
							t.Errorf("message %d delivery %d claimed twice: by %s and %s", id, a.c.Deliveries, a.worker, b.worker)
						}
						// b claimed while a's claim still hid it.
						if a.c.Deliveries < b.c.Deliveries && b.claimed.Before(a.c.VisibleAt) {
							overlaps++
							if overlaps < 5 {
								t.Errorf("message %d: delivery %d (%s) claimed at %s, before delivery %d (%s) became visible at %s",
									id, b.c.Deliveries, b.worker, b.claimed, a.c.Deliveries, a.worker, a.c.VisibleAt)
							}
						}
					}
				}
			}
			t.Logf("%d claims of %d messages", len(recs), len(byID))
		})
	}
}
