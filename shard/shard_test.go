package shard

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

func loads(a map[string]string) map[string]int {
	l := map[string]int{}
	for _, p := range a {
		l[p]++
	}
	return l
}

func TestShare(t *testing.T) {
	for _, c := range []struct{ n, m, want int }{
		{12, 3, 4}, {12, 5, 3}, {12, 12, 1}, {12, 13, 1}, {1, 1, 1}, {0, 3, 0}, {12, 0, 0}, {7, 2, 4},
	} {
		if got := Share(c.n, c.m); got != c.want {
			t.Errorf("Share(%d, %d) = %d, want %d", c.n, c.m, got, c.want)
		}
	}
}

func TestAssignCoversEveryShardWithinTheShare(t *testing.T) {
	shards := names("orders-", 12)
	a := Assign(shards, []string{"pod-a", "pod-b", "pod-c"})
	if len(a) != 12 {
		t.Fatalf("%d of 12 shards assigned: %v", len(a), a)
	}
	for p, n := range loads(a) {
		if n != 4 {
			t.Errorf("%s assigned %d shards, want 4 (12 over 3): %v", p, n, a)
		}
	}
	if got := Assign(shards, nil); len(got) != 0 {
		t.Errorf("no peers: %v, want no assignment", got)
	}
}

func TestAssignIsTheSameWhateverTheOrderOfItsInput(t *testing.T) {
	shards, peers := names("s", 20), names("pod-", 6)
	want := Assign(shards, peers)
	r := rand.New(rand.NewPCG(7, 7))
	for range 20 {
		s, p := slices.Clone(shards), slices.Clone(peers)
		r.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
		r.Shuffle(len(p), func(i, j int) { p[i], p[j] = p[j], p[i] })
		p = append(p, p[0]) // a duplicate counts once
		if got := Assign(s, p); !maps.Equal(got, want) {
			t.Fatalf("assignment depends on input order:\n%v\n%v", got, want)
		}
	}
}

func TestPlanFor(t *testing.T) {
	shards := names("orders-", 6)
	peers := []string{"pod-a", "pod-b"}
	a := Assign(shards, peers)
	var mine, theirs []string
	for _, s := range shards {
		if a[s] == "pod-a" {
			mine = append(mine, s)
		} else {
			theirs = append(theirs, s)
		}
	}
	// pod-a holds one of its own and one of pod-b's.
	p := PlanFor("pod-a", shards, peers, []string{mine[0], theirs[0]})
	if p.Share != 3 || !slices.Equal(p.Assigned, mine) || !slices.Equal(p.Shed, []string{theirs[0]}) || !slices.Equal(p.Try, mine[1:]) {
		t.Errorf("PlanFor = %+v; want share 3, assigned %v, shed %v, try %v", p, mine, theirs[:1], mine[1:])
	}
	// A pod that is not up sheds all it holds and tries nothing.
	p = PlanFor("pod-c", shards, peers, []string{mine[0]})
	if p.Share != 0 || len(p.Assigned) != 0 || len(p.Try) != 0 || !slices.Equal(p.Shed, []string{mine[0]}) {
		t.Errorf("PlanFor(not a peer) = %+v; want share 0, shed %v only", p, mine[:1])
	}
}

// TestAssignProperties: for random N and M, the shares cover N, no pod is
// over ceil(N/M), and a change of M by one moves few shards: each time at
// most the forced moves plus half the set (near N = M, shares of one or two
// cascade), and over the sample at most 1.5
// times the least a balanced assignment must move (N/(M+1) on a join, the
// leaver's shards on a leave).
func TestAssignProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 42))
	var joinMoves, joinLeast, leaveMoves, leaveLeast int
	for range 1000 {
		n, m := 1+r.IntN(100), 1+r.IntN(16)
		shards := names("orders-", n)
		peers := make([]string, m)
		for i := range peers {
			peers[i] = fmt.Sprintf("pod-%08x", r.Uint32())
		}
		a := Assign(shards, peers)
		checkCover(t, shards, peers, a)

		// One joins.
		joined := append(slices.Clone(peers), fmt.Sprintf("pod-%08x", r.Uint32()))
		b := Assign(shards, joined)
		checkCover(t, shards, joined, b)
		forced := 0
		for _, l := range loads(a) {
			forced += max(0, l-Share(n, m+1))
		}
		mv := Moves(a, b)
		if mv > forced+(n+1)/2 {
			t.Errorf("N=%d M=%d→%d: %d moves, forced %d", n, m, m+1, mv, forced)
		}
		joinMoves += mv
		joinLeast += n / (m + 1)

		// One leaves.
		if m == 1 {
			continue
		}
		k := r.IntN(m)
		left := slices.Delete(slices.Clone(peers), k, k+1)
		c := Assign(shards, left)
		checkCover(t, shards, left, c)
		forced = loads(a)[peers[k]] // the leaver's shards must move
		mv = Moves(a, c)
		if mv > forced+(n+1)/2 {
			t.Errorf("N=%d M=%d→%d: %d moves, forced %d", n, m, m-1, mv, forced)
		}
		leaveMoves += mv
		leaveLeast += forced
	}
	t.Logf("moves against the least: join %.2f, leave %.2f", float64(joinMoves)/float64(joinLeast), float64(leaveMoves)/float64(leaveLeast))
	if float64(joinMoves) > 1.5*float64(joinLeast) || float64(leaveMoves) > 1.5*float64(leaveLeast) {
		t.Errorf("moves %d (join) and %d (leave) against the least %d and %d: over 1.5 times", joinMoves, leaveMoves, joinLeast, leaveLeast)
	}
}

func checkCover(t *testing.T, shards, peers []string, a map[string]string) {
	t.Helper()
	if len(a) != len(shards) {
		t.Fatalf("N=%d M=%d: %d shards assigned", len(shards), len(peers), len(a))
	}
	for _, s := range shards {
		if !slices.Contains(peers, a[s]) {
			t.Fatalf("shard %s assigned to %q, not a peer", s, a[s])
		}
	}
	share := Share(len(shards), len(peers))
	for p, l := range loads(a) {
		if l > share {
			t.Fatalf("N=%d M=%d: %s assigned %d, over ceil(N/M) = %d", len(shards), len(peers), p, l, share)
		}
	}
}
