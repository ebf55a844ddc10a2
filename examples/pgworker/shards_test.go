package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
	"github.com/handoff-dev/handoff/internal/kubetest"
	"github.com/handoff-dev/handoff/protocol"
)

// seq numbers the test's leadership messages.
var seq int64

func lead(t *testing.T, w *testWorker, shard string, leader bool, token int64) {
	t.Helper()
	seq++
	l := protocol.Leadership{Lease: shard, Leader: leader, Sequence: seq}
	if leader {
		l.FencingToken, l.Until, l.ValidForMillis = token, time.Now().Add(time.Minute), time.Minute.Milliseconds()
	}
	if err := w.sidecar.SetLeadership(context.Background(), l); err != nil {
		t.Fatal(err)
	}
}

// applied counts the messages of shard applied, by worker.
func applied(t *testing.T, pool *pgxpool.Pool, shard string) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
SELECT p.worker, count(*) FROM handoff_processed p JOIN handoff_enqueued e USING (dedup_key)
WHERE p.dedup_key LIKE $1 || '-%' GROUP BY p.worker`, shard)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var w string
		var n int
		if err := rows.Scan(&w, &n); err != nil {
			t.Fatal(err)
		}
		out[w] = n
	}
	return out
}

func enqueueShard(t *testing.T, pool *pgxpool.Pool, shard string, from, n, workMillis int) {
	t.Helper()
	var msgs []queue.Message
	for i := from; i < from+n; i++ {
		msgs = append(msgs, queue.Message{DedupKey: fmt.Sprintf("%s-%03d", shard, i), Amount: 1, WorkMillis: workMillis, Shard: shard})
	}
	if err := queue.Enqueue(context.Background(), pool, msgs); err != nil {
		t.Fatal(err)
	}
}

// A worker with --shards claims only messages of the shards it leads; the
// revoke of a shard is acknowledged once that shard's started work is done
// and its unstarted claims handed back, and nothing of it is claimed after;
// the next holder's completions are fenced by its greater token.
func TestShardWorkerClaimsOnlyTheShardsItLeads(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	a := startWorkerWith(t, pool, options{workerID: "pod-a", batch: 4, visibilityTimeout: time.Hour, pollInterval: 5 * time.Millisecond, shards: []string{"s-0", "s-1"}})
	enqueueShard(t, pool, "s-0", 0, 10, 20)
	enqueueShard(t, pool, "s-1", 0, 10, 0)

	lead(t, a, "s-0", true, 3)
	kubetest.WaitFor(t, 10*time.Second, "pod-a to apply some of s-0", func() bool { return applied(t, pool, "s-0")["pod-a"] >= 2 })
	// The revoke returns once pod-a's work of s-0 has stopped.
	lead(t, a, "s-0", false, 0)
	done := applied(t, pool, "s-0")["pod-a"]
	if got := applied(t, pool, "s-1"); len(got) != 0 {
		t.Errorf("s-1, never led, had messages applied: %v", got)
	}
	var claimed int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM handoff_queue WHERE shard = 's-0' AND claimed_by IS NOT NULL AND visible_at > now()`).Scan(&claimed); err != nil {
		t.Fatal(err)
	}
	if claimed != 0 {
		t.Errorf("after the revoke of s-0, %d of its messages are still claimed: want them handed back", claimed)
	}
	time.Sleep(100 * time.Millisecond) // 20 polls: a loop still claiming s-0 would show
	if now := applied(t, pool, "s-0")["pod-a"]; now != done {
		t.Errorf("pod-a applied %d of s-0 after its revoke was acknowledged (%d before)", now-done, done)
	}

	// pod-b leads s-0 next, with a greater token, and finishes it.
	b := startWorkerWith(t, pool, options{workerID: "pod-b", batch: 4, visibilityTimeout: time.Hour, pollInterval: 5 * time.Millisecond, shards: []string{"s-0", "s-1"}})
	lead(t, b, "s-0", true, 4)
	kubetest.WaitFor(t, 10*time.Second, "pod-b to apply the rest of s-0", func() bool {
		got := applied(t, pool, "s-0")
		return got["pod-a"]+got["pod-b"] == 10
	})
	var token int64
	if err := pool.QueryRow(context.Background(), `SELECT token FROM handoff_fence WHERE lease = 's-0'`).Scan(&token); err != nil || token != 4 {
		t.Errorf("s-0's fence = %d, %v; want pod-b's token 4", token, err)
	}
	r, err := queue.Check(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if r.Duplicates != 0 || r.Pending != 10 { // s-1's 10
		t.Errorf("report %s: want no duplicates and s-1's 10 pending", r)
	}
	if err := r.Err(); err != nil {
		t.Error(err)
	}
}

func TestShardsFlag(t *testing.T) {
	o, err := parseFlags([]string{"--database-url", "postgres://x", "--worker-id", "w", "--shards", "orders-{0..2}"})
	if err != nil || len(o.shards) != 3 || o.shards[2] != "orders-2" {
		t.Fatalf("--shards orders-{0..2} = %v, %v: want orders-0 … orders-2", o.shards, err)
	}
	_, err = parseFlags([]string{"--database-url", "postgres://x", "--worker-id", "w", "--shards", "orders-{1..2}"})
	if err == nil || !strings.Contains(err.Error(), "--shards") || !strings.Contains(err.Error(), "PREFIX{0..K}") {
		t.Fatalf("--shards orders-{1..2}: %v, want an error naming --shards and the form", err)
	}
}
