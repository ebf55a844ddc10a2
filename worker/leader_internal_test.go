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

// A grant with a new fencing token ends the old term, whose leader work
// may still run (it sees its context end, and stops in its own time). A
// revoke of the Lease then waits for that work too, not only for the new
// term's: the protocol's ack means all leader work for the Lease stopped.
func TestRevokeWaitsForTheWorkOfAReplacedTerm(t *testing.T) {
	fake := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	a, err := New(Options{Clock: fake, InsecureNoToken: true})
	if err != nil {
		t.Fatal(err)
	}
	a.grant(Leadership{Lease: "l", FencingToken: 1, Until: fake.Now().Add(time.Hour)})
	oldCtx, _, oldDone, err := a.BeginLeading(context.Background(), "l")
	if err != nil {
		t.Fatal(err)
	}
	a.grant(Leadership{Lease: "l", FencingToken: 2, Until: fake.Now().Add(time.Hour)})
	select {
	case <-oldCtx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the old term's work context did not end at the grant with a new fencing token")
	}
	_, _, newDone, err := a.BeginLeading(context.Background(), "l")
	if err != nil {
		t.Fatal(err)
	}
	newDone()
	acked := make(chan error, 1)
	go func() { acked <- a.revoke(context.Background(), "l") }()
	select {
	case err := <-acked:
		t.Fatalf("revoke returned (%v) while the replaced term's leader work still ran", err)
	case <-time.After(100 * time.Millisecond):
	}
	oldDone()
	select {
	case err := <-acked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("revoke did not return once every leader work was done")
	}
	// Done: a later revoke does not wait for it again.
	a.grant(Leadership{Lease: "l", FencingToken: 3, Until: fake.Now().Add(time.Hour)})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.revoke(ctx, "l"); err != nil {
		t.Fatalf("a revoke with no leader work left: %v", err)
	}
}
