package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/handoff-dev/handoff/protocol"
)

// Bounds of the suite's calls and waits.
const (
	// callBound bounds every call beyond the wait it asks for: an answer
	// later than that fails the case.
	callBound = 5 * time.Second
	// atOnce bounds an answer the protocol says comes at once (a drain
	// with waitMillis 0, a grant).
	atOnce = time.Second
	// shortTerm is the term of the grants that must run out during a case.
	shortTerm = 400 * time.Millisecond
	// early is how long the suite waits for an answer that must not come
	// yet (a revoke while leader work runs) once the app has shown it is
	// handling the call.
	early = 300 * time.Millisecond
	// drainWait is the waitMillis of the long poll that must wait it out.
	drainWait = 500 * time.Millisecond
	// cancelWait is the cancelWaitMillis of the cancel fallback.
	cancelWait = 300 * time.Millisecond
	// poll paces the fixture's Stopping checks, and the drain status
	// polls that watch for a hand-back.
	poll = 20 * time.Millisecond
	// ageWait is how long the suite watches runningMillis age.
	ageWait = 300 * time.Millisecond
	// clockSlack is what a time the app reports may be off by, on the
	// same machine: rounding to whole milliseconds, and the clocks read
	// at different points of a call.
	clockSlack = 10 * time.Millisecond
	// handBackBound bounds the hand-back of unstarted claims after
	// stop-claiming: "at once", through the queue, in the background.
	handBackBound = 3 * time.Second
)

// signer sets a call's authentication headers, given its body; nil signs
// it as the sidecar does (protocol.Sign with the pod's token, now).
type signer func(req *http.Request, body []byte)

type suite struct {
	t      Target
	c      *http.Client
	base   string // the URL calls are sent to, before the protocol's paths
	ep     protocol.Endpoint
	bad    error // Target.URL is not an address
	rep    Report
	term   time.Duration // the term of an ordinary grant, under the lease duration
	ld     time.Duration
	id     string // names this run's Leases
	leases int
	last   int64 // the last sequence handed out

	// The drain group's state, for its cases: the claims it holds (0
	// without a Fixture), started between heldFrom and heldBy (Fixture.Hold
	// returns once they are); whether stop-claiming stopped claiming, and
	// its first answer.
	drainHeld        int
	heldFrom, heldBy time.Time
	stopped          bool
	first            protocol.DrainStatus
}

func newSuite(t Target) *suite {
	e, bad := protocol.ParseEndpoint(t.URL)
	if bad != nil {
		bad = fmt.Errorf("Target.URL: %w", bad)
	}
	c := t.Client
	if c == nil {
		c = &http.Client{Transport: e.Transport(4, 30*time.Second), CheckRedirect: protocol.NoRedirects}
	}
	ld := t.LeaseDuration
	if ld <= 0 {
		ld = protocol.MaxLeaseDuration
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &suite{t: t, c: c, base: e.URL(), ep: e, bad: bad, ld: ld, term: min(10*time.Second, ld/2), id: hex.EncodeToString(b[:])}
}

// ready restarts the app when there is a Fixture, and checks that it
// answers the drain status and is not stopping.
func (s *suite) ready(ctx context.Context) error {
	if s.bad != nil {
		return fmt.Errorf("not run: %w", s.bad)
	}
	if s.t.Fixture != nil {
		if err := s.t.Fixture.Restart(ctx); err != nil {
			return fmt.Errorf("not run: Fixture.Restart: %w", err)
		}
	}
	st, err := s.status(ctx)
	if err != nil {
		return fmt.Errorf("not run: the app does not answer the drain status: %w", err)
	}
	if st.Stopping {
		return fmt.Errorf("not run: the app is stopping already (stop-claiming is one-way): give a fresh app process, or a Fixture to restart it")
	}
	return nil
}

// errSkip marks a case skipped, with its reason.
type errSkip struct{ reason string }

func (e errSkip) Error() string { return e.reason }

func (s *suite) record(c Case) {
	s.rep.Cases = append(s.rep.Cases, c)
	if s.t.Logf != nil {
		s.t.Logf("%s  %s  %s", c.Result, c.Name, c.Reason)
	}
}

// run runs one case: f returns the reason it passed, or an error saying
// why it failed (errSkip: skipped).
func (s *suite) run(ctx context.Context, name string, f func(context.Context) (string, error)) {
	if ctx.Err() != nil {
		s.record(Case{Name: name, Result: Skip, Reason: "not run: " + context.Cause(ctx).Error()})
		return
	}
	start := time.Now()
	reason, err := f(ctx)
	took := time.Since(start)
	var skip errSkip
	switch {
	case errors.As(err, &skip):
		s.record(Case{Name: name, Result: Skip, Reason: skip.reason, Duration: took})
	case err != nil:
		s.record(Case{Name: name, Result: Fail, Reason: oneLine(err.Error()), Duration: took})
	default:
		s.record(Case{Name: name, Result: Pass, Reason: reason, Duration: took})
	}
}

// runIdle runs a case that relies on an app that has not stopped claiming
// and must leave it so: every case before the drain group. Before it, an
// app found stopping (an earlier call stopped it, with an earlier case's
// failure, or the app stopped by itself) is restarted with the Fixture, or
// the case is skipped without one, as its result would say nothing of what
// it checks. After it, an app found stopping fails the case: none of its
// calls is a signed stop-claiming, so one of them stopped the app.
func (s *suite) runIdle(ctx context.Context, name string, f func(context.Context) (string, error)) {
	s.run(ctx, name, func(ctx context.Context) (string, error) {
		if err := s.idle(ctx); err != nil {
			return "", err
		}
		reason, err := f(ctx)
		if err != nil {
			return reason, err
		}
		st, err := s.status(ctx)
		if err != nil {
			return "", fmt.Errorf("after the case, the drain status: %w", err)
		}
		if st.Stopping {
			return "", errors.New("the app says stopping after this case's calls, none of them a signed stop-claiming: one of them stopped its claiming")
		}
		return reason, nil
	})
}

// idle makes sure the app is not stopping: it restarts a stopping app with
// the Fixture, and returns errSkip without one.
func (s *suite) idle(ctx context.Context) error {
	st, err := s.status(ctx)
	if err != nil {
		return fmt.Errorf("before the case, the drain status: %w", err)
	}
	if !st.Stopping {
		return nil
	}
	if s.t.Fixture == nil {
		return errSkip{"the app was stopping before this case (an earlier call stopped its claiming; see the cases before), and without a Fixture (--fixture-cmd) the suite cannot restart it"}
	}
	if err := s.t.Fixture.Restart(ctx); err != nil {
		return fmt.Errorf("the app was stopping before this case; Fixture.Restart: %w", err)
	}
	if st, err = s.status(ctx); err != nil {
		return fmt.Errorf("the app was stopping before this case; after Fixture.Restart, the drain status: %w", err)
	}
	if st.Stopping {
		return errors.New("the app was stopping before this case, and still is after Fixture.Restart")
	}
	return nil
}

// runLeader runs a case that needs a LeaderFixture, on an idle app
// (runIdle).
func (s *suite) runLeader(ctx context.Context, name string, f func(context.Context) (string, error)) {
	if s.t.Leader == nil {
		s.record(Case{Name: name, Result: Skip, Reason: "needs a LeaderFixture (--leader-cmd): the protocol shows a term's end only through leader work"})
		return
	}
	s.runIdle(ctx, name, f)
}

// failAll records each case as failed for reason (a group's set-up failed).
func (s *suite) failAll(names []string, reason string) {
	for _, n := range names {
		s.record(Case{Name: n, Result: Fail, Reason: oneLine(reason)})
	}
}

func (s *suite) skipAll(names []string, reason string) {
	for _, n := range names {
		s.record(Case{Name: n, Result: Skip, Reason: reason})
	}
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// lease names a Lease of this run, new for each call.
func (s *suite) lease(what string) string {
	s.leases++
	return fmt.Sprintf("conformance-%s-%s-%d", s.id, what, s.leases)
}

// next is a sequence above every one handed out before, and at least the
// current time in Unix nanoseconds (as the sidecar's), 1 µs apart so that
// one fits between two.
func (s *suite) next() int64 {
	s.last = max(time.Now().UnixNano(), s.last+1000)
	return s.last
}

// answer is the app's answer to one call.
type answer struct {
	code   int
	header http.Header
	body   []byte
	took   time.Duration
}

func (a answer) String() string {
	return fmt.Sprintf("%d %s", a.code, bytes.TrimSpace(a.body))
}

// call sends one call, signed as the sidecar signs it (sign nil) or by
// sign, bounded by wait plus callBound. The request target is s.t.URL's
// path (none for a socket) and path.
func (s *suite) call(ctx context.Context, method, path, body string, sign signer, wait time.Duration) (answer, error) {
	ctx, cancel := context.WithTimeout(ctx, wait+callBound)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, rd)
	if err != nil {
		return answer{}, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if sign == nil {
		protocol.Sign(req, s.t.Token, []byte(body), time.Now())
	} else {
		sign(req, []byte(body))
	}
	start := time.Now()
	resp, err := s.c.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return answer{}, fmt.Errorf("%s %s: no answer within %s", method, path, wait+callBound)
		}
		return answer{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	return answer{code: resp.StatusCode, header: resp.Header, body: b, took: time.Since(start)}, nil
}

// ok sends a call with the token, wants 200 and decodes the answer into
// out.
func (s *suite) ok(ctx context.Context, method, path, body string, wait time.Duration, out any) (answer, error) {
	a, err := s.call(ctx, method, path, body, nil, wait)
	if err != nil {
		return a, err
	}
	if a.code != http.StatusOK {
		return a, fmt.Errorf("%s %s %s = %s, want 200", method, path, short(body), a)
	}
	if out != nil {
		if err := json.Unmarshal(a.body, out); err != nil {
			return a, fmt.Errorf("%s %s: answer %s is not the protocol's JSON: %w", method, path, a, err)
		}
	}
	return a, nil
}

func short(body string) string {
	if len(body) > 80 {
		return body[:80] + "…"
	}
	return body
}

// wantError checks a refusal: code, and a JSON body with a non-empty error.
func wantError(what string, a answer, codes ...int) error {
	good := false
	for _, c := range codes {
		good = good || a.code == c
	}
	if !good {
		return fmt.Errorf("%s = %s, want %v", what, a, codes)
	}
	var e struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(a.body, &e); err != nil || e.Error == "" {
		return fmt.Errorf("%s = %s: want a JSON body {\"error\": \"...\"} saying why", what, a)
	}
	return nil
}

// status asks for the drain status with waitMillis 0.
func (s *suite) status(ctx context.Context) (protocol.DrainStatus, error) {
	var st protocol.DrainStatus
	_, err := s.ok(ctx, http.MethodGet, protocol.DrainPath+"?waitMillis=0", "", 0, &st)
	return st, err
}

// answerBound is how long the sidecar waits for a stop-claiming or a grant
// (docs/protocol.md: it bounds stop-claiming by 1 s and a grant by
// min(retry period, 1 s)): an app that answers later has its answer
// dropped, and the call counts as failed.
const answerBound = time.Second

func (s *suite) stopClaiming(ctx context.Context) (protocol.DrainStatus, answer, error) {
	var st protocol.DrainStatus
	start := time.Now()
	a, err := s.ok(ctx, http.MethodPost, protocol.StopClaimingPath, "{}", 0, &st)
	if took := time.Since(start); err == nil && took > answerBound {
		err = fmt.Errorf("stop-claiming answered after %s: the sidecar waits %s, then takes the call as failed; answer at once", took.Round(time.Millisecond), answerBound)
	}
	return st, a, err
}

func (s *suite) drain(ctx context.Context, query string, wait time.Duration) (protocol.DrainStatus, answer, error) {
	var st protocol.DrainStatus
	a, err := s.ok(ctx, http.MethodGet, protocol.DrainPath+query, "", wait, &st)
	return st, a, err
}

// consistent checks the drain status's own arithmetic.
func consistent(st protocol.DrainStatus) error {
	if st.InFlight < 0 || st.Unstarted < 0 || st.Receiving < 0 || st.Unstarted > st.InFlight {
		return fmt.Errorf("drain status %+v: want counts ≥ 0 and unstarted ≤ inFlight", st)
	}
	if st.Drained != (st.InFlight == 0 && st.Receiving == 0) {
		return fmt.Errorf("drain status %+v: drained must be inFlight == 0 && receiving == 0", st)
	}
	return nil
}

// grantBody is a grant as the sidecar sends it.
func grantBody(lease string, seq int64, validFor time.Duration, until time.Time) string {
	b, _ := json.Marshal(protocol.Leadership{Lease: lease, Leader: true, Sequence: seq, HolderIdentity: "conformance_0000", FencingToken: 1,
		Until: until, ValidForMillis: validFor.Milliseconds()})
	return string(b)
}

func revokeBody(lease string, seq int64) string {
	b, _ := json.Marshal(protocol.Leadership{Lease: lease, Leader: false, Sequence: seq})
	return string(b)
}

// lead sends one leadership body for lease and returns the ack.
func (s *suite) lead(ctx context.Context, lease, body string) (protocol.LeadershipAck, answer, error) {
	var ack protocol.LeadershipAck
	a, err := s.ok(ctx, http.MethodPut, protocol.LeasePathPrefix+lease, body, 0, &ack)
	return ack, a, err
}

// grant grants lease an ordinary term with seq and wants it applied.
func (s *suite) grant(ctx context.Context, lease string, seq int64) error {
	return s.grantFor(ctx, lease, seq, s.term, time.Now().Add(s.term))
}

func (s *suite) grantFor(ctx context.Context, lease string, seq int64, validFor time.Duration, until time.Time) error {
	start := time.Now()
	ack, a, err := s.lead(ctx, lease, grantBody(lease, seq, validFor, until))
	if err != nil {
		return err
	}
	if took := time.Since(start); took > answerBound {
		return fmt.Errorf("a grant of %s answered after %s: the sidecar waits at most %s, then takes the call as failed; answer a grant at once", lease, took.Round(time.Millisecond), answerBound)
	}
	if !ack.Leader || ack.Stale {
		return fmt.Errorf("grant of %s with sequence %d (the latest) = %s, want {\"leader\": true} without stale", lease, seq, a)
	}
	return nil
}

// revoke revokes lease with seq and wants the ack.
func (s *suite) revoke(ctx context.Context, lease string, seq int64) error {
	ack, a, err := s.lead(ctx, lease, revokeBody(lease, seq))
	if err != nil {
		return err
	}
	if ack.Leader || ack.Stale {
		return fmt.Errorf("revoke of %s with sequence %d (the latest) = %s, want {\"leader\": false} without stale", lease, seq, a)
	}
	return nil
}

// wantStale sends body, a message older than the last applied, and wants
// it answered stale, echoing leader.
func (s *suite) wantStale(ctx context.Context, lease, body string, leader bool, what string) error {
	ack, a, err := s.lead(ctx, lease, body)
	if err != nil {
		return err
	}
	if !ack.Stale || ack.Leader != leader {
		return fmt.Errorf("%s = %s, want {\"leader\": %t, \"stale\": true}", what, a, leader)
	}
	return nil
}

// leads begins leader work through the LeaderFixture and wants it begun.
func (s *suite) leads(ctx context.Context, lease, when string) error {
	ok, err := s.t.Leader.Lead(ctx, lease)
	if err != nil {
		return fmt.Errorf("LeaderFixture.Lead(%s): %w", lease, err)
	}
	if !ok {
		return fmt.Errorf("the app does not lead %s %s", lease, when)
	}
	return nil
}

// leadsNot wants leader work refused.
func (s *suite) leadsNot(ctx context.Context, lease, when string) error {
	ok, err := s.t.Leader.Lead(ctx, lease)
	if err != nil {
		return fmt.Errorf("LeaderFixture.Lead(%s): %w", lease, err)
	}
	if ok {
		_ = s.t.Leader.Release(ctx, lease)
		return fmt.Errorf("the app began leader work for %s %s", lease, when)
	}
	return nil
}

// waitStopping waits, until bound, for the app to tell the leader work
// of lease to stop; done, if set, ends the wait with its error.
func (s *suite) waitStopping(ctx context.Context, lease string, bound time.Duration, done func() error) (bool, error) {
	deadline := time.Now().Add(bound)
	for {
		stopping, err := s.t.Leader.Stopping(ctx, lease)
		if err != nil {
			return false, fmt.Errorf("LeaderFixture.Stopping(%s): %w", lease, err)
		}
		if stopping {
			return true, nil
		}
		if done != nil {
			if err := done(); err != nil {
				return false, err
			}
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-time.After(poll):
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}
