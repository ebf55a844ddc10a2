package worker

import (
	"context"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func leadingNames(ls []Leadership) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Lease)
	}
	return out
}

// The app learns which shards it leads, with the fencing token of each,
// and is told at each term's start and end: grant, renewal (no change),
// revoke, a new fencing token, and the end of a term at its Until.
func TestLeadingListsTheShardsLedAndLeadershipChangedTellsEachStartAndEnd(t *testing.T) {
	fake := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	a, err := New(Options{Clock: fake, InsecureNoToken: true})
	if err != nil {
		t.Fatal(err)
	}
	shards := []string{"s-0", "s-1", "s-2"}
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	expectChange := func(what string, ch <-chan struct{}, want bool) {
		t.Helper()
		if got := closed(ch); got != want {
			t.Errorf("%s: LeadershipChanged closed = %t, want %t", what, got, want)
		}
	}

	ch := a.LeadershipChanged()
	a.grant(Leadership{Lease: "s-2", FencingToken: 7, Until: fake.Now().Add(10 * time.Second)})
	expectChange("grant of s-2", ch, true)
	ch = a.LeadershipChanged()
	a.grant(Leadership{Lease: "s-0", FencingToken: 3, Until: fake.Now().Add(2 * time.Second)})
	a.grant(Leadership{Lease: "other", FencingToken: 1, Until: fake.Now().Add(10 * time.Second)})
	expectChange("grant of s-0", ch, true)
	if got := a.Leading(shards...); !slices.Equal(leadingNames(got), []string{"s-0", "s-2"}) || got[0].FencingToken != 3 || got[1].FencingToken != 7 {
		t.Fatalf("Leading(shards) = %+v, want s-0 (token 3) and s-2 (token 7)", got)
	}
	if got := leadingNames(a.Leading()); !slices.Equal(got, []string{"other", "s-0", "s-2"}) {
		t.Errorf("Leading() = %v, want every Lease led, sorted", got)
	}

	ch = a.LeadershipChanged()
	a.grant(Leadership{Lease: "s-2", FencingToken: 7, Until: fake.Now().Add(20 * time.Second)})
	expectChange("renewal of s-2", ch, false)

	fake.Step(2 * time.Second) // s-0's term runs out
	expectChange("s-0's term run out", ch, true)
	if got := leadingNames(a.Leading(shards...)); !slices.Equal(got, []string{"s-2"}) {
		t.Errorf("after s-0's Until, Leading = %v, want [s-2]", got)
	}

	ch = a.LeadershipChanged()
	if err := a.revoke(context.Background(), "s-2"); err != nil {
		t.Fatal(err)
	}
	expectChange("revoke of s-2", ch, true)
	if got := a.Leading(shards...); len(got) != 0 {
		t.Errorf("after the revoke, Leading = %v, want none", got)
	}
	ch = a.LeadershipChanged()
	if err := a.revoke(context.Background(), "s-2"); err != nil {
		t.Fatal(err)
	}
	expectChange("a second revoke of s-2", ch, false)

	a.grant(Leadership{Lease: "s-1", FencingToken: 4, Until: fake.Now().Add(10 * time.Second)})
	ch = a.LeadershipChanged()
	a.grant(Leadership{Lease: "s-1", FencingToken: 9, Until: fake.Now().Add(10 * time.Second)})
	expectChange("a new fencing token for s-1", ch, true)
	if got := a.Leading("s-1"); len(got) != 1 || got[0].FencingToken != 9 {
		t.Errorf("Leading(s-1) = %+v, want token 9", got)
	}
}

func TestShardsFromEnv(t *testing.T) {
	t.Setenv("HANDOFF_SHARDS", "s-0, s-1,,s-2")
	if got := ShardsFromEnv(); !slices.Equal(got, []string{"s-0", "s-1", "s-2"}) {
		t.Errorf("ShardsFromEnv() = %v, want s-0, s-1, s-2", got)
	}
	t.Setenv("HANDOFF_SHARDS", "")
	if got := ShardsFromEnv(); len(got) != 0 {
		t.Errorf("ShardsFromEnv() with none = %v", got)
	}
}
