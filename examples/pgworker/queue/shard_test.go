package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
)

// A worker leading a shard claims only that shard's messages, and its
// completion is fenced by the shard's token: once a later holder (a greater
// token) has completed a message of the shard, the earlier holder's
// completion writes nothing, and the message stays for the later holder.
func TestClaimShardAndCompleteFenced(t *testing.T) {
	pool := newQueue(t)
	ctx := context.Background()
	enqueue(t, pool,
		queue.Message{DedupKey: "a1", Amount: 1, Shard: "s-0"},
		queue.Message{DedupKey: "plain", Amount: 10},
		queue.Message{DedupKey: "b1", Amount: 100, Shard: "s-1"},
		queue.Message{DedupKey: "a2", Amount: 1000, Shard: "s-0"},
		queue.Message{DedupKey: "a3", Amount: 10000, Shard: "s-0"},
	)
	got, err := queue.ClaimShard(ctx, pool, "old", "s-0", time.Minute, 10)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, c := range got {
		keys = append(keys, c.DedupKey)
		if c.Shard != "s-0" {
			t.Errorf("claimed %s of shard %q from s-0", c.DedupKey, c.Shard)
		}
	}
	if len(keys) != 3 || keys[0] != "a1" || keys[1] != "a2" || keys[2] != "a3" {
		t.Fatalf("ClaimShard(s-0) claimed %v, want a1, a2, a3", keys)
	}
	if plain := claim(t, pool, "other", time.Minute); plain == nil || plain.DedupKey != "plain" || plain.Shard != "" {
		t.Errorf("Claim of no shard = %+v, want the message of no shard", plain)
	}

	// The old holder, token 3, completes a1.
	if applied, err := queue.CompleteFenced(ctx, pool, "old", got[0], 3); err != nil || !applied {
		t.Fatalf("CompleteFenced(a1, token 3) = %t, %v", applied, err)
	}
	// The shard moves: the new holder, token 4, claims a2 again (its claim
	// returned) and completes it.
	if _, err := queue.ReturnClaims(ctx, pool, "old"); err != nil {
		t.Fatal(err)
	}
	again, err := queue.ClaimShard(ctx, pool, "new", "s-0", time.Minute, 1)
	if err != nil || len(again) != 1 || again[0].DedupKey != "a2" {
		t.Fatalf("new holder's claim = %v, %v; want a2", again, err)
	}
	if applied, err := queue.CompleteFenced(ctx, pool, "new", again[0], 4); err != nil || !applied {
		t.Fatalf("CompleteFenced(a2, token 4) = %t, %v", applied, err)
	}
	// The old holder, still working a3 with token 3, is refused.
	applied, err := queue.CompleteFenced(ctx, pool, "old", got[2], 3)
	if !errors.Is(err, queue.ErrStaleFencingToken) || applied {
		t.Fatalf("CompleteFenced(a3, stale token 3) = %t, %v; want ErrStaleFencingToken", applied, err)
	}
	r := check(t, pool)
	if r.Total != 1+1000 || r.Pending != 3 {
		t.Errorf("after the stale completion: total %d, pending %d; want 1001 and 3 (a3, plain, b1): %s", r.Total, r.Pending, r)
	}
	if err := r.Err(); err != nil {
		t.Error(err)
	}
	// A message of no shard cannot be completed fenced.
	if _, err := queue.CompleteFenced(ctx, pool, "other", &queue.Claimed{ID: 1}, 1); err == nil {
		t.Error("CompleteFenced of a message of no shard: accepted")
	}
}
