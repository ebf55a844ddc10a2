package sidecar

import (
	"testing"
	"time"

	"github.com/handoff-dev/handoff/protocol"
)

// The cost ranks pods as a scale-in should take them: idle first, then
// claims held unstarted, then work in progress (the younger first), then
// partition holders, and role Lease holders last.
func TestDeletionCostRanksBusyPodsDearest(t *testing.T) {
	working := func(inFlight int, age time.Duration) protocol.DrainStatus {
		return protocol.DrainStatus{InFlight: inFlight, RunningMillis: age.Milliseconds()}
	}
	ranked := []struct {
		name       string
		role, part int
		st         protocol.DrainStatus
		want       int32
	}{
		{"idle, a receive pending", 0, 0, protocol.DrainStatus{Receiving: 1}, 0},
		{"a prefetched batch, none started", 0, 0, protocol.DrainStatus{InFlight: 5, Unstarted: 5}, 1},
		{"work of 2s", 0, 0, working(3, 2*time.Second), 10},
		{"work of 30s", 0, 0, working(1, 30*time.Second), 20},
		{"work of 5m", 0, 0, working(1, 5*time.Minute), 30},
		{"work of 20m", 0, 0, working(1, 20*time.Minute), 40},
		{"work of 3h", 0, 0, working(1, 3*time.Hour), 50},
		{"a partition Lease, idle", 0, 1, protocol.DrainStatus{}, 100},
		{"two partitions and work of 3h", 0, 2, working(1, 3*time.Hour), 250},
		{"a role Lease, idle", 1, 0, protocol.DrainStatus{}, 10_000},
		{"a role Lease and work of 20m", 1, 0, working(1, 20*time.Minute), 10_040},
		{"two role Leases", 2, 0, protocol.DrainStatus{}, 20_000},
		{"more Leases than counted", 500, 500, working(1, 3*time.Hour), 999_950},
	}
	prev := int32(-1)
	for _, tc := range ranked {
		got := DeletionCost(tc.role, tc.part, tc.st)
		if got != tc.want {
			t.Errorf("%s: DeletionCost = %d, want %d", tc.name, got, tc.want)
		}
		if got <= prev {
			t.Errorf("%s: cost %d not above the pod ranked before it (%d)", tc.name, got, prev)
		}
		prev = got
	}
	// Work in progress counts claims started, whatever the app's age says.
	if got := DeletionCost(0, 0, protocol.DrainStatus{InFlight: 2, Unstarted: 2, RunningMillis: 99_999}); got != 1 {
		t.Errorf("unstarted claims with an age: DeletionCost = %d, want 1", got)
	}
}

// A higher cost is written at once, a lower one after costSettle, and
// writes never exceed the token bucket: costBurst at once, then one per
// costEvery.
func TestCostKeeperWritesRisesAtOnceFallsAfterSettling(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	k := newCostKeeper()
	step := func(at time.Duration, want int32, write bool) {
		t.Helper()
		if got := k.decide(t0.Add(at), want); got != write {
			t.Fatalf("at %s, cost %d on the pod (known %v), want %d: decide = %v, want %v", at, k.onPod, k.known, want, got, write)
		}
		if write {
			k.wrote(want)
		}
	}
	step(0, 0, true)                   // unknown on the pod: written
	step(2*time.Second, 0, false)      // unchanged
	step(4*time.Second, 10, true)      // dearer: at once
	step(6*time.Second, 10_010, true)  // dearer again: the burst's third
	step(8*time.Second, 10_020, false) // dearer, the bucket empty
	step(14*time.Second, 10_020, true) // a token back after costEvery
	step(16*time.Second, 10, false)    // cheaper: waits to settle
	step(30*time.Second, 10_020, false)
	step(32*time.Second, 10, false) // cheaper again: the wait starts over
	step(50*time.Second, 0, false)  // 18s below: not yet
	step(52*time.Second, 0, true)   // 20s below
}
