package sidecar

import (
	"testing"
	"time"

	"github.com/handoff-dev/handoff/config"
)

func TestPlanBudgets(t *testing.T) {
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	s := &config.Settings{HandbackReserve: 2 * time.Second}
	at := start.Add
	for _, tc := range []struct {
		name                          string
		deadline                      time.Time
		drainBy, fallbackBy, revokeBy time.Time
		leftForReleaseAtStart         time.Duration
	}{
		{"a 28s deadline: drain to 26s, return by 27s, revoke and release by 28s",
			at(28 * time.Second), at(26 * time.Second), at(27 * time.Second), at(28 * time.Second), 28 * time.Second},
		{"less time than the reserve: no drain wait, the fallback by half the reserve before the deadline",
			at(1500 * time.Millisecond), start, at(500 * time.Millisecond), at(1500 * time.Millisecond), 1500 * time.Millisecond},
		{"a late trigger, past the deadline: nothing waits, every step gets the floor",
			at(-3 * time.Second), start, start, at(-3 * time.Second), minStep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := plan(s, start, tc.deadline)
			if !b.DrainBy.Equal(tc.drainBy) || !b.FallbackBy.Equal(tc.fallbackBy) || !b.RevokeBy.Equal(tc.revokeBy) || !b.ReleaseBy.Equal(tc.deadline) {
				t.Errorf("drain by %s, fallback by %s, revoke by %s, release by %s (from the start); want %s, %s, %s, %s",
					b.DrainBy.Sub(start), b.FallbackBy.Sub(start), b.RevokeBy.Sub(start), b.ReleaseBy.Sub(start),
					tc.drainBy.Sub(start), tc.fallbackBy.Sub(start), tc.revokeBy.Sub(start), tc.deadline.Sub(start))
			}
			if got := b.left(start, b.ReleaseBy); got != tc.leftForReleaseAtStart {
				t.Errorf("time left for the release at the start %s, want %s", got, tc.leftForReleaseAtStart)
			}
			if got := b.left(tc.deadline.Add(time.Minute), b.ReleaseBy); got != minStep {
				t.Errorf("time left for the release past the deadline %s, want the floor %s", got, minStep)
			}
			if b.PodRead != podReadTimeout || b.StopClaiming != stopClaimingTimeout || b.Floor != minStep {
				t.Errorf("pod read %s, stop-claiming %s, floor %s", b.PodRead, b.StopClaiming, b.Floor)
			}
		})
	}
}
