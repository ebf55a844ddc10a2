package worker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// Leader work cannot begin once revoke has returned (the ack), however
// BeginLeading and revoke interleave. Run with -race: the count of leader
// work must be safe against the revoke's wait.
func TestNoLeaderWorkBeginsAfterRevokeReturned(t *testing.T) {
	fake := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	var late atomic.Int64
	for range 500 {
		a, err := New(Options{Clock: fake, InsecureNoToken: true})
		if err != nil {
			t.Fatal(err)
		}
		a.grant(Leadership{Lease: "l", FencingToken: 1, Until: fake.Now().Add(time.Hour)})
		var acked atomic.Bool
		var workers sync.WaitGroup
		for range 4 {
			workers.Add(1)
			go func() {
				defer workers.Done()
				for {
					ctx, _, done, err := a.BeginLeading(context.Background(), "l")
					if errors.Is(err, ErrNotLeader) {
						return
					}
					if acked.Load() {
						late.Add(1) // began after the ack: the next leader may be running
					}
					<-ctx.Done()
					done()
				}
			}()
		}
		if err := a.revoke(context.Background(), "l"); err != nil {
			t.Fatal(err)
		}
		acked.Store(true)
		workers.Wait()
	}
	if n := late.Load(); n > 0 {
		t.Fatalf("%d leader work began after the revoke was acknowledged", n)
	}
}
