// Package conformance checks an app's side of the handoff protocol: it
// drives the endpoints the sidecar calls (docs/protocol.md, "What the app
// serves") over HTTP, the way the sidecar does, through the cases the
// protocol defines, and reports each case as pass, fail or skip with a
// one-line reason. Any implementation can be checked, in any language: the
// suite speaks only HTTP to the app, and asks the app for what HTTP cannot
// make it do (hold claims, begin leader work) through a Fixture and a
// LeaderFixture.
//
// # Cases
//
// The cases are one table (table.go): each has an ID ("auth/replay-refused",
// the name a Report gives it), the group it runs in, the rule of
// docs/protocol.md it checks, quoted, with that rule's anchor, and its run
// function. Catalog lists them; Cases lists their IDs.
//
// # Order and fresh processes
//
// Stop-claiming is one-way for an app process, and a return or a cancel
// changes what the process holds, so the cases run in a fixed order, in
// groups:
//
//  1. the app as given, or with a Fixture a fresh process (Restart),
//     which must answer and not be stopping, else every case fails: the
//     pod's token (401), bad requests (4xx), leadership ordered by
//     sequence, refused messages (422) (group idle), and, with a
//     LeaderFixture, the term on the app's own clock, the revoke ack after
//     leader work stopped and a stale revoke leaving leader work alone
//     (group leader); with a Fixture, a restart names a new instance, and
//     the restarted process refuses, and acts on none of, the calls
//     signed before the restart began (group restart);
//  2. the drain, on that same process without a Fixture, or on a fresh one
//     (Fixture.Restart) holding 3 claims with one: stop-claiming (twice),
//     the drain long poll and its edge values, leadership during the drain
//     (group drain);
//  3. with a Fixture only, each on a fresh process holding claims: return
//     (counts, repeated; group return), cancel then return (cancel), with
//     a CancelFixture what cancel hands back of work that ended because of
//     it (cancel-ended), a return that stops claiming when stop-claiming
//     never came (return-unstopped), and, with an UnstartedFixture, the
//     unstarted claims stop-claiming hands back (unstarted).
//
// Without a Fixture the cases that need claims held are reported skip,
// never pass; without a LeaderFixture, those that need leader work.
//
// The app under test must be idle: no claim and no wait of its own, beside
// the fixture's. Every call is bounded (5 s beyond any wait it asks for): a
// call unanswered by then fails its case.
package conformance

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Target is the app under test.
type Target struct {
	// URL is the app API's address, as the sidecar's --app-url takes it
	// (protocol.ParseEndpoint): "unix:///handoff-run/app.sock", or
	// "http://127.0.0.1:7452".
	URL string
	// Token is the pod's token, the key of the calls' signatures, which
	// the app checks (docs/protocol.md, "Signed calls").
	Token string
	// Fixture makes the app hold claims; nil: the cases that need claims
	// held are skipped.
	Fixture Fixture
	// Leader makes the app begin leader work; nil: the cases that need
	// leader work are skipped.
	Leader LeaderFixture
	// LeaseDuration is the lease duration the app bounds grants by
	// (HANDOFF_LEASE_DURATION); 0: protocol.MaxLeaseDuration. The suite's
	// grants stay under it, and its over-long grants go beyond it.
	LeaseDuration time.Duration
	// Client sends the calls; nil: a client of its own, without a proxy.
	Client *http.Client
	// Logf, if set, receives a line for each case as it ends.
	Logf func(format string, args ...any)
}

// Fixture makes the app under test hold claims, for the cases that need
// work in flight. Each method is bounded by its ctx.
type Fixture interface {
	// Restart replaces the app with a fresh process (a new instance, not
	// stopping, holding nothing, whose receiver took its start after
	// Restart was called) answering at Target.URL, and returns once it
	// answers. The suite calls it first, in each case of the group
	// restart, and before each group that needs claims (five in all,
	// beside the CancelFixture and UnstartedFixture groups).
	Restart(ctx context.Context) error
	// Hold makes the app claim n messages and keep them started and
	// unfinished until Finish, counted in flight (worker: Receive.Hold).
	// The work ignores cancellation: it stands for work that does not stop
	// in time, so a cancel fallback waits its cancelWaitMillis and hands
	// the claims back. Hold is called only before stop-claiming.
	Hold(ctx context.Context, n int) error
	// Finish finishes every claim Hold made and the app still holds (worker:
	// Claim.Done after acknowledging the message). Claims handed back
	// before are left alone.
	Finish(ctx context.Context) error
}

// CancelFixture is a Fixture that can also make the app hold claims whose
// work ends at the cancel fallback, for the case of what cancel hands back.
// A Fixture that is not one has that case skipped.
type CancelFixture interface {
	Fixture
	// HoldCancelable makes the app claim n messages whose work, started,
	// ends as soon as the cancel fallback cancels it, without
	// acknowledging its message (worker: Receive.Hold, then Claim.Done once
	// Claim.Context ends, the message left claimed in the queue). It
	// returns an error wrapping errors.ErrUnsupported when the app cannot;
	// the case is then skipped.
	HoldCancelable(ctx context.Context, n int) error
}

// UnstartedFixture is a Fixture that can also make the app hold claims
// received and not started (the rest of a batch, a prefetch), for the
// case of what stop-claiming hands back at once. A Fixture that is not one
// has that case skipped.
type UnstartedFixture interface {
	Fixture
	// HoldUnstarted makes the app claim n messages and hold them
	// unstarted, counted in inFlight and unstarted (worker:
	// Receive.HoldUnstarted, with Options.HandBack set), until
	// stop-claiming hands them back or Finish drops them; work on one the
	// app starts instead runs until Finish, as Hold's does. It returns an
	// error wrapping errors.ErrUnsupported when the app cannot; the case
	// is then skipped.
	HoldUnstarted(ctx context.Context, n int) error
}

// LeaderFixture makes the app under test begin leader work, for the cases
// that need to see when the app stops leading: the protocol gives an
// outsider no other view of a term (the app's answer to a grant is at once,
// whatever the term). Each method is bounded by its ctx.
type LeaderFixture interface {
	// Lead begins leader work for lease (worker: BeginLeading), work that
	// runs until Release. It returns false, and no error, when the app
	// does not lead lease (worker: ErrNotLeader).
	Lead(ctx context.Context, lease string) (bool, error)
	// Stopping reports whether the app has told the leader work begun for
	// lease to stop, because the term ended: revoked, or run out on the
	// app's clock (worker: BeginLeading's context is done).
	Stopping(ctx context.Context, lease string) (bool, error)
	// Release ends the leader work begun for lease (worker: BeginLeading's
	// done): from then on the app may ack a revoke of lease.
	Release(ctx context.Context, lease string) error
}

// Result is a case's outcome.
type Result string

// Outcomes of a case.
const (
	Pass Result = "pass"
	Fail Result = "fail"
	Skip Result = "skip" // the case needs a Fixture or LeaderFixture the Target lacks, or an earlier step failed
)

// Case is one case of the suite and its outcome.
type Case struct {
	Name   string `json:"name"`
	Result Result `json:"result"`
	// Reason is one line: what was checked, or what went wrong.
	Reason string `json:"reason"`
	// Duration is how long the case ran (0 for one not run).
	Duration time.Duration `json:"-"`
}

// Report is the outcome of every case, in the order run.
type Report struct {
	Cases []Case
}

// Count is the number of cases with result r.
func (r Report) Count(res Result) int {
	n := 0
	for _, c := range r.Cases {
		if c.Result == res {
			n++
		}
	}
	return n
}

// Failed reports whether any case failed.
func (r Report) Failed() bool { return r.Count(Fail) > 0 }

// Case returns the case named name, and false if none ran.
func (r Report) Case(name string) (Case, bool) {
	for _, c := range r.Cases {
		if c.Name == name {
			return c, true
		}
	}
	return Case{}, false
}

// String is one line per case, "pass  name  reason", then a summary.
func (r Report) String() string {
	var b strings.Builder
	for _, c := range r.Cases {
		fmt.Fprintf(&b, "%-4s  %-44s %s\n", c.Result, c.Name, c.Reason)
	}
	fmt.Fprintf(&b, "%d passed, %d failed, %d skipped\n", r.Count(Pass), r.Count(Fail), r.Count(Skip))
	return b.String()
}

// held is how many claims the drain group holds.
const held = 3

// Run runs every case against t and returns their outcomes. It ends
// early, reporting the cases not run as skip, when ctx ends.
func Run(ctx context.Context, t Target) Report {
	s := newSuite(t)
	if err := s.ready(ctx); err != nil {
		s.failAll(Cases(), err.Error())
		return s.rep
	}
	for _, g := range groups {
		g.run(s, ctx, casesOf(g.name))
	}
	return s.rep
}
