package sidecar

import (
	"time"

	"github.com/handoff-dev/handoff/config"
)

// budgets are the time limits of one shutdown sequence, computed once from
// its start and deadline (plan), logged at the start, and used by every
// step. Times are on the Coordinator's clock.
type budgets struct {
	Started time.Time
	// PodRead bounds each read of the pod from the API, when the watch
	// cannot answer.
	PodRead time.Duration
	// StopClaiming bounds the stop-claiming call; the drain polls anyway.
	StopClaiming time.Duration
	// Deadline: the sequence is over by then (the pod's deletion, or the
	// grace period of the kill, less deadline-margin).
	Deadline time.Time
	// DrainBy ends the drain wait: the deadline less handback-reserve, kept
	// for the fallback, the revoke and the release; never before Started.
	DrainBy time.Time
	// FallbackBy ends the return (or cancel) of unfinished claims: half the
	// reserve before the deadline, so the revoke and release keep the other
	// half.
	FallbackBy time.Time
	// RevokeBy and ReleaseBy end the leadership revoke and the release
	// (the revoke also ends with the term the app was given): of the role
	// Leases, which start at once beside the drain, and of the partition
	// Leases, which start after the fallback.
	RevokeBy, ReleaseBy time.Time
	// Floor is the least time any bounded step is given, even past the
	// deadline, so that a late trigger still stops claiming, revokes and
	// releases.
	Floor time.Duration
}

// plan computes the budgets of a sequence started at started with deadline.
func plan(s *config.Settings, started, deadline time.Time) budgets {
	latest := func(a, b time.Time) time.Time {
		if a.After(b) {
			return a
		}
		return b
	}
	return budgets{
		Started:      started,
		PodRead:      podReadTimeout,
		StopClaiming: stopClaimingTimeout,
		Deadline:     deadline,
		DrainBy:      latest(deadline.Add(-s.HandbackReserve), started),
		FallbackBy:   latest(deadline.Add(-s.HandbackReserve/2), started),
		RevokeBy:     deadline,
		ReleaseBy:    deadline,
		Floor:        minStep,
	}
}

// left is the time from now until t, but never less than the floor.
func (b budgets) left(now, t time.Time) time.Duration { return max(t.Sub(now), b.Floor) }

// logValues are the budgets as key/value pairs for the log, in durations
// from the start.
func (b budgets) logValues() []any {
	since := func(t time.Time) string { return t.Sub(b.Started).String() }
	return []any{"deadline", b.Deadline, "deadlineIn", since(b.Deadline), "drainFor", since(b.DrainBy),
		"fallbackBy", since(b.FallbackBy), "revokeBy", since(b.RevokeBy), "releaseBy", since(b.ReleaseBy),
		"podRead", b.PodRead.String(), "stopClaiming", b.StopClaiming.String(), "floor", b.Floor.String()}
}
