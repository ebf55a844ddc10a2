package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
	"github.com/handoff-dev/handoff/internal/kubetest"
)

// startListeningWorker is startWorkerWith with the claim loops woken by a
// queue.Listener, as run starts them.
func startListeningWorker(t *testing.T, pool *pgxpool.Pool, opts options) *testWorker {
	t.Helper()
	return startTestWorker(t, pool, opts, true)
}

// processedBy counts the messages of keys worker completed.
func processedBy(t *testing.T, pool *pgxpool.Pool, worker string, keys ...string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM handoff_processed WHERE worker = $1 AND dedup_key = ANY($2)`, worker, keys).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// An idle worker polling every hour claims at once what becomes visible:
// a message enqueued, and the unstarted claims another worker hands back
// at stop-claiming.
func TestIdleWorkerIsWokenWhenMessagesBecomeVisible(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	a := startBatchHolder(t, pool)
	b := startListeningWorker(t, pool, options{workerID: "pod-b", concurrency: 1, batch: 4, visibilityTimeout: time.Hour, pollInterval: time.Hour})
	b.waitReceiving(t, 1)

	if err := queue.Enqueue(ctx, pool, []queue.Message{{DedupKey: "e1", Amount: 1}}); err != nil {
		t.Fatal(err)
	}
	kubetest.WaitFor(t, 10*time.Second, "pod-b (polling every hour) to complete the message enqueued", func() bool {
		return processedBy(t, pool, "pod-b", "e1") == 1
	})
	b.waitReceiving(t, 1)
	if _, err := a.sidecar.StopClaiming(ctx); err != nil {
		t.Fatal(err)
	}
	kubetest.WaitFor(t, 10*time.Second, "pod-b (polling every hour) to complete the 3 messages pod-a handed back", func() bool {
		return processedBy(t, pool, "pod-b", "m1", "m2", "m3") == 3
	})
}

// A shard's idle claim loop polling every hour claims at once a message of
// its shard enqueued while it leads it.
func TestIdleShardLoopIsWokenByAnEnqueue(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	w := startListeningWorker(t, pool, options{workerID: "pod-a", batch: 4, visibilityTimeout: time.Hour, pollInterval: time.Hour, shards: []string{"s-0"}})
	lead(t, w, "s-0", true, 1)
	w.waitReceiving(t, 1)
	enqueueShard(t, pool, "s-0", 0, 2, 0)
	kubetest.WaitFor(t, 10*time.Second, "the shard loop (polling every hour) to complete the 2 messages enqueued", func() bool {
		return applied(t, pool, "s-0")["pod-a"] == 2
	})
}
