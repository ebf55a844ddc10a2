package queue_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/handoff-dev/handoff/examples/pgworker/queue"
)

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
func TestBreakConcurrentBatchClaims(t *testing.T) {
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
