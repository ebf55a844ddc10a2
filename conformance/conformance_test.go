package conformance_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/conformance"
	"github.com/handoff-dev/handoff/internal/sockettest"
	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
)

const testToken = "conformance-test-token-0123456789abcdef"

// goApp is an app built on package worker, served by httptest: its
// Fixture holds real claims (Receive, Hold) and hands them back through
// ReturnClaims; Restart makes a new Agent, as a new process would.
type goApp struct {
	t     *testing.T
	mu    sync.Mutex
	agent *worker.Agent
	// claims held by Hold and not yet finished or handed back
	claims []*worker.Claim
	// unacked counts the messages whose work ended at the cancel fallback
	// without acknowledging them: still claimed in the queue.
	unacked int
	// heldOnly, set, is a broken app: its ReturnClaims hands back only the
	// claims still held, not the messages of work ended by the cancel.
	heldOnly bool
	// noHandBack, set, is a broken app: it has no HandBack, so its
	// unstarted claims stay held to the drain deadline.
	noHandBack bool
	// started is when Restart began making the current Agent: no later
	// than its receiver started.
	started time.Time
}

func newGoApp(t *testing.T) *goApp {
	g := &goApp{t: t}
	if err := g.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	return g
}

func (g *goApp) current() *worker.Agent {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.agent
}

func (g *goApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.current().Handler().ServeHTTP(w, r)
}

func (g *goApp) Restart(context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	started := time.Now()
	opts := worker.Options{Token: testToken, ReturnClaims: g.returnClaims}
	if !g.noHandBack {
		// The queue has them again at once: nothing to do but say so.
		opts.HandBack = func(context.Context, []*worker.Claim) error { return nil }
	}
	a, err := worker.New(opts)
	if err != nil {
		return err
	}
	for _, c := range g.claims {
		c.Done()
	}
	g.agent, g.claims, g.unacked, g.started = a, nil, 0, started
	return nil
}

// startedAt is when Restart began making the current Agent.
func (g *goApp) startedAt() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.started
}

// HoldCancelable holds n claims whose work ends at the cancel fallback
// without acknowledging its message.
func (g *goApp) HoldCancelable(ctx context.Context, n int) error {
	// The claims outlive the call (a fixture command's request ends
	// before the work does): only the cancel fallback ends their work.
	r, err := g.current().Receive(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	defer r.End()
	for range n {
		c := r.Hold()
		go func() {
			<-c.Context().Done()
			if errors.Is(context.Cause(c.Context()), worker.ErrCanceled) {
				g.mu.Lock()
				g.unacked++
				g.mu.Unlock()
			}
			c.Done()
		}()
	}
	return nil
}

// HoldUnstarted holds n claims received and not started, as the rest of a
// batch: HandBack takes them at stop-claiming, else Finish ends them.
func (g *goApp) HoldUnstarted(ctx context.Context, n int) error {
	return g.hold(ctx, n, func(r *worker.Receive, i int) *worker.Claim { return r.HoldUnstarted(i) })
}

// Hold holds n claims started, whose work ignores Claim.Context: it runs
// until Finish.
func (g *goApp) Hold(ctx context.Context, n int) error {
	return g.hold(ctx, n, func(r *worker.Receive, _ int) *worker.Claim { return r.Hold() })
}

// hold holds n claims, each taken by take, until Finish.
func (g *goApp) hold(ctx context.Context, n int, take func(r *worker.Receive, i int) *worker.Claim) error {
	r, err := g.current().Receive(ctx)
	if err != nil {
		return err
	}
	defer r.End()
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range n {
		g.claims = append(g.claims, take(r, i))
	}
	return nil
}

func (g *goApp) Finish(context.Context) error {
	g.mu.Lock()
	cs := g.claims
	g.claims = nil
	g.mu.Unlock()
	for _, c := range cs {
		c.Done()
	}
	return nil
}

// returnClaims hands back every claim still held: the queue has them again.
func (g *goApp) returnClaims(context.Context) (int, error) {
	g.mu.Lock()
	cs, unacked := g.claims, g.unacked
	g.claims, g.unacked = nil, 0
	if g.heldOnly {
		unacked = 0
	}
	g.mu.Unlock()
	for _, c := range cs {
		c.Done()
	}
	return len(cs) + unacked, nil
}

// serveApp serves h on an app socket until the test ends and returns its
// address.
func serveApp(t *testing.T, h http.Handler) string {
	t.Helper()
	e, _ := sockettest.Serve(t, "app.sock", h)
	return e.String()
}

// serve runs the suite against h in front of app, on the app socket.
func serve(t *testing.T, app *goApp, h http.Handler) conformance.Report {
	t.Helper()
	return serveWith(t, app, h, conformance.AgentLeader(app.current))
}

// serveWith is serve with leader as the LeaderFixture.
func serveWith(t *testing.T, app *goApp, h http.Handler, leader conformance.LeaderFixture) conformance.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep := conformance.Run(ctx, conformance.Target{
		URL: serveApp(t, h), Token: testToken, Fixture: app, Leader: leader,
	})
	t.Logf("\n%s", rep)
	return rep
}

func TestWorkerPackagePassesEveryCase(t *testing.T) {
	app := newGoApp(t)
	rep := serve(t, app, app)
	if rep.Count(conformance.Pass) != len(rep.Cases) {
		t.Fatalf("want every case passed, got %d passed of %d:\n%s", rep.Count(conformance.Pass), len(rep.Cases), rep)
	}
	var names []string
	for _, c := range rep.Cases {
		names = append(names, c.Name)
	}
	if !slices.Equal(names, conformance.Cases()) {
		t.Fatalf("cases run %v, want conformance.Cases() %v", names, conformance.Cases())
	}
}

// An app already stopping (stop-claiming is one-way) fails every case
// rather than passing some on a process the suite cannot check.
func TestAStoppingAppFailsEveryCase(t *testing.T) {
	a, err := worker.New(worker.Options{Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	a.StopClaiming()
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	rep := conformance.Run(context.Background(), conformance.Target{URL: srv.URL, Token: testToken})
	if rep.Count(conformance.Fail) != len(conformance.Cases()) || !strings.Contains(rep.Cases[0].Reason, "stopping already") {
		t.Fatalf("want every case failed, saying the app is stopping:\n%s", rep)
	}
}

func TestWithoutFixturesCasesAreSkippedNotPassed(t *testing.T) {
	a, err := worker.New(worker.Options{Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	rep := conformance.Run(context.Background(), conformance.Target{URL: srv.URL, Token: testToken})
	t.Logf("\n%s", rep)
	if rep.Failed() {
		t.Fatalf("failed without fixtures:\n%s", rep)
	}
	for _, name := range []string{"leadership/revoke-acked-after-leader-work-stopped", "leadership/term-ends-at-validForMillis", "leadership/term-ends-at-until", "leadership/stale-revoke-leaves-leader-work",
		"drain/long-poll-waits-waitMillis", "drain/waitMillis-0-answers-at-once", "drain/long-poll-returns-when-drained", "return/counts", "return/cancel-then-return", "return/cancel-hands-back-canceled-work", "auth/signed-before-start-refused"} {
		if c, _ := rep.Case(name); c.Result != conformance.Skip {
			t.Errorf("%s = %s (%s), want skip without its fixture", name, c.Result, c.Reason)
		}
	}
	for _, name := range []string{"auth/unsigned-refused", "auth/bad-signature-refused", "auth/stale-timestamp-refused", "auth/replay-refused", "auth/scheme-in-any-case", "leadership/ordered-by-sequence", "stop-claiming/idempotent", "drain/waitMillis-above-bound"} {
		if c, _ := rep.Case(name); c.Result != conformance.Pass {
			t.Errorf("%s = %s (%s), want pass: it needs no fixture", name, c.Result, c.Reason)
		}
	}
}

// resign signs r anew, as it came, with the pod's token now: a broken app
// that takes any call for a genuine one.
func resign(r *http.Request, body []byte) {
	ts := strconv.FormatInt(time.Now().UnixMilli(), 10)
	nonce := protocol.NewNonce()
	r.Header.Set(protocol.TimestampHeader, ts)
	r.Header.Set(protocol.NonceHeader, nonce)
	r.Header.Set("Authorization", protocol.AuthScheme+" "+protocol.Signature(testToken, r.Method, r.RequestURI, ts, nonce, protocol.BodyDigest(body)))
}

// genuine says whether r is signed with the pod's token: a verifier of its
// own (the app's keeps its nonces), started when the test binary did, so
// that a call signed before this check is not refused as signed before the
// receiver started (protocol.ErrBeforeStart).
func genuine(r *http.Request, body []byte) bool { return genuineSince(testStart, r, body) }

// genuineSince says whether r is signed with the pod's token, within the
// clock skew, by a verifier of its own that started at since.
func genuineSince(since time.Time, r *http.Request, body []byte) bool {
	started := false
	now := func() time.Time {
		if !started { // NewVerifier's reading: its start
			started = true
			return since
		}
		return time.Now()
	}
	return protocol.NewVerifier(testToken, now).Verify(r, body) == nil
}

// testStart is when the test binary started: before any call its tests sign.
var testStart = time.Now()

// nonces are those a broken app has seen.
var nonces = struct {
	sync.Mutex
	seen map[string]bool
}{seen: map[string]bool{}}

// rewrite is a broken app: the Go worker with one defect in front of it.
type rewrite func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) bool

func broken(app *goApp, f rewrite) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if f(w, r, body, app) {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		app.ServeHTTP(w, r)
	})
}

// leadership decodes a leadership call's body; false for other calls or
// bodies that are not one.
func leadership(r *http.Request, body []byte) (protocol.Leadership, bool) {
	var l protocol.Leadership
	if r.Method != http.MethodPut || !strings.HasPrefix(r.URL.Path, protocol.LeasePathPrefix) || json.Unmarshal(body, &l) != nil {
		return l, false
	}
	return l, true
}

// forward sends r on with body b, into a recorder, and returns it.
func forward(next http.Handler, r *http.Request, b []byte) *httptest.ResponseRecorder {
	rr := httptest.NewRecorder()
	r2 := r.Clone(context.WithoutCancel(r.Context()))
	r2.Body = io.NopCloser(bytes.NewReader(b))
	next.ServeHTTP(rr, r2)
	return rr
}

// drainStatus is a broken app whose drain status answers are the real
// ones changed by change.
func drainStatus(change func(*protocol.DrainStatus)) rewrite {
	return func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) bool {
		if r.URL.Path != protocol.DrainPath {
			return false
		}
		rr := forward(next, r, body)
		var st protocol.DrainStatus
		if rr.Code != http.StatusOK || json.Unmarshal(rr.Body.Bytes(), &st) != nil {
			copyTo(w, rr)
			return true
		}
		change(&st)
		b, _ := json.Marshal(st)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
		return true
	}
}

func copyTo(w http.ResponseWriter, rr *httptest.ResponseRecorder) {
	for k, v := range rr.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rr.Code)
	_, _ = w.Write(rr.Body.Bytes())
}

func TestBrokenAppsFailTheirCases(t *testing.T) {
	var counter, stops struct {
		sync.Mutex
		n int64
	}
	last := struct {
		sync.Mutex
		seq map[string]int64
	}{seq: map[string]int64{}}
	returns := struct {
		sync.Mutex
		seen map[string]bool
	}{seen: map[string]bool{}}
	for _, tc := range []struct {
		name string
		f    rewrite
		app  func(*goApp) // breaks the app itself
		// leader, if set, breaks the LeaderFixture
		leader func(conformance.LeaderFixture) conformance.LeaderFixture
		fails  []string
	}{{
		name: "acks a revoke before leader work stopped",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) bool {
			l, ok := leadership(r, body)
			if !ok || l.Leader {
				return false
			}
			go forward(next, r, body) // the real revoke, which waits for leader work
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"leader": false}`))
			return true
		},
		fails: []string{"leadership/revoke-acked-after-leader-work-stopped"},
	}, {
		name: "ignores sequence order",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) bool {
			l, ok := leadership(r, body)
			if !ok {
				return false
			}
			counter.Lock()
			counter.n++
			l.Sequence = time.Now().UnixNano() + counter.n // every message newer than the last
			counter.Unlock()
			b, _ := json.Marshal(l)
			copyTo(w, forward(next, r, b))
			return true
		},
		fails: []string{"leadership/ordered-by-sequence", "leadership/stale-revoke-leaves-leader-work"},
	}, {
		name: "answers 200 to bad JSON",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, _ http.Handler) bool {
			if r.Method == http.MethodGet || json.Valid(body) {
				return false
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"returned": 0, "leader": true}`))
			return true
		},
		fails: []string{"bad-request/return-body", "bad-request/leadership-body"},
	}, {
		name: "serves calls without checking their signature",
		f: func(_ http.ResponseWriter, r *http.Request, body []byte, _ http.Handler) bool {
			resign(r, body)
			return false
		},
		fails: []string{"auth/unsigned-refused", "auth/bad-signature-refused", "auth/stale-timestamp-refused", "auth/replay-refused", "auth/scheme-in-any-case", "auth/signed-before-start-refused"},
	}, {
		// Seen in an app written from the docs alone: it read the scheme,
		// in any case, and refused a call without it, but checked no
		// signature.
		name: "reads the scheme and checks no signature",
		f: func(_ http.ResponseWriter, r *http.Request, body []byte, _ http.Handler) bool {
			if scheme, _, _ := strings.Cut(r.Header.Get("Authorization"), " "); strings.EqualFold(scheme, protocol.AuthScheme) {
				resign(r, body)
			}
			return false
		},
		fails: []string{"auth/bad-signature-refused", "auth/scheme-in-any-case"},
	}, {
		name:  "names the same instance in every process",
		f:     drainStatus(func(st *protocol.DrainStatus) { st.Instance = "always-the-same" }),
		fails: []string{"restart/new-instance"},
	}, {
		name: "answers stop-claiming after more than a second",
		f: func(_ http.ResponseWriter, r *http.Request, body []byte, _ http.Handler) bool {
			if r.URL.Path == protocol.StopClaimingPath && r.Method == http.MethodPost && genuine(r, body) {
				time.Sleep(1200 * time.Millisecond)
			}
			return false
		},
		fails: []string{"stop-claiming/answers-stopping"},
	}, {
		name: "serves a call sent again",
		f: func(_ http.ResponseWriter, r *http.Request, body []byte, _ http.Handler) bool {
			nonces.Lock()
			defer nonces.Unlock()
			if n := r.Header.Get(protocol.NonceHeader); nonces.seen[n] {
				resign(r, body)
			} else {
				nonces.seen[n] = true
			}
			return false
		},
		fails: []string{"auth/replay-refused"},
	}, {
		// A receiver whose nonces live in memory and that takes no start:
		// a call of the process before, replayed within 30 s of a
		// restart, is served (issue 31).
		name: "serves a call signed before it started, within the skew",
		f: func(_ http.ResponseWriter, r *http.Request, body []byte, next http.Handler) bool {
			ms, _ := strconv.ParseInt(r.Header.Get(protocol.TimestampHeader), 10, 64)
			if ms < next.(*goApp).startedAt().UnixMilli() && genuineSince(time.Time{}, r, body) {
				resign(r, body)
			}
			return false
		},
		fails: []string{"auth/signed-before-start-refused"},
	}, {
		// The sidecar signs a call anew only on the refusal that says it
		// was signed before the receiver started.
		name: "refuses a call signed before it started for another reason",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) bool {
			ms, _ := strconv.ParseInt(r.Header.Get(protocol.TimestampHeader), 10, 64)
			if ms >= next.(*goApp).startedAt().UnixMilli() || !genuineSince(time.Time{}, r, body) {
				return false
			}
			protocol.Refuse(w, fmt.Errorf("%w: a call of another process", protocol.ErrReplayed))
			return true
		},
		fails: []string{"auth/signed-before-start-refused"},
	}, {
		name: "acts on a return it refuses as signed before it started",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) bool {
			ms, _ := strconv.ParseInt(r.Header.Get(protocol.TimestampHeader), 10, 64)
			if r.URL.Path != protocol.ReturnPath || ms >= next.(*goApp).startedAt().UnixMilli() || !genuineSince(time.Time{}, r, body) {
				return false
			}
			resign(r, body)
			forward(next, r, body) // acted on, then refused
			protocol.Refuse(w, fmt.Errorf("%w: too late", protocol.ErrBeforeStart))
			return true
		},
		fails: []string{"auth/signed-before-start-refused"},
	}, {
		name: "serves a call signed a minute away",
		f: func(_ http.ResponseWriter, r *http.Request, body []byte, _ http.Handler) bool {
			ms, _ := strconv.ParseInt(r.Header.Get(protocol.TimestampHeader), 10, 64)
			if d := time.Since(time.UnixMilli(ms)); d > 20*time.Second || d < -20*time.Second {
				resign(r, body)
			}
			return false
		},
		fails: []string{"auth/stale-timestamp-refused"},
	}, {
		name: "answers the drain at once whatever waitMillis",
		f: func(_ http.ResponseWriter, r *http.Request, _ []byte, _ http.Handler) bool {
			if r.URL.Path == protocol.DrainPath && r.URL.Query().Get("waitMillis") != "" {
				r.URL.RawQuery = "waitMillis=0"
			}
			return false
		},
		fails: []string{"drain/long-poll-waits-waitMillis"},
	}, {
		name: "reads waitMillis above the bound as a bad request",
		f: func(w http.ResponseWriter, r *http.Request, _ []byte, _ http.Handler) bool {
			if r.URL.Path == protocol.DrainPath && len(r.URL.Query().Get("waitMillis")) > 5 {
				w.WriteHeader(http.StatusBadRequest)
				_, _ = w.Write([]byte(`{"error": "too long"}`))
				return true
			}
			return false
		},
		fails: []string{"drain/waitMillis-above-bound"},
	}, {
		name: "leads for validForMillis beyond its value (until only)",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) bool {
			l, ok := leadership(r, body)
			if !ok || !l.Leader {
				return false
			}
			l.ValidForMillis = 10_000
			b, _ := json.Marshal(l)
			copyTo(w, forward(next, r, b))
			return true
		},
		fails: []string{"leadership/term-ends-at-validForMillis"},
	}, {
		name: "leads past until (validForMillis only)",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) bool {
			l, ok := leadership(r, body)
			if !ok || !l.Leader {
				return false
			}
			l.Until = time.Time{}
			b, _ := json.Marshal(l)
			copyTo(w, forward(next, r, b))
			return true
		},
		fails: []string{"leadership/term-ends-at-until"},
	}, {
		name: "stops claiming on any method",
		f: func(_ http.ResponseWriter, r *http.Request, body []byte, _ http.Handler) bool {
			if r.URL.Path == protocol.StopClaimingPath && r.Method != http.MethodPost && genuine(r, body) {
				r.Method = http.MethodPost
				resign(r, body) // its defect is the method, not the signature
			}
			return false
		},
		fails: []string{"bad-request/unknown-path-or-method"},
	}, {
		name: "does not wait for canceled work",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) bool {
			var req protocol.ReturnRequest
			if r.URL.Path != protocol.ReturnPath || json.Unmarshal(body, &req) != nil || !req.Cancel {
				return false
			}
			req.CancelWaitMillis = 0
			b, _ := json.Marshal(req)
			copyTo(w, forward(next, r, b))
			return true
		},
		fails: []string{"return/cancel-then-return"},
	}, {
		name: "waits all of cancelWaitMillis though canceled work has ended",
		f: func(_ http.ResponseWriter, r *http.Request, body []byte, _ http.Handler) bool {
			var req protocol.ReturnRequest
			if r.URL.Path == protocol.ReturnPath && json.Unmarshal(body, &req) == nil && req.Cancel {
				time.Sleep(time.Duration(req.CancelWaitMillis) * time.Millisecond)
			}
			return false
		},
		fails: []string{"return/cancel-hands-back-canceled-work"},
	}, {
		name:  "hands back only the claims still held after a cancel",
		f:     func(http.ResponseWriter, *http.Request, []byte, http.Handler) bool { return false },
		app:   func(g *goApp) { g.heldOnly = true },
		fails: []string{"return/cancel-hands-back-canceled-work"},
	}, {
		name: "counts a return wrong",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) bool {
			if r.URL.Path != protocol.ReturnPath || r.Method != http.MethodPost || !json.Valid(body) {
				return false
			}
			rr := forward(next, r, body)
			var res protocol.ReturnResult
			if rr.Code == http.StatusOK && json.Unmarshal(rr.Body.Bytes(), &res) == nil {
				res.Returned = 0 // handed back, but says none
				b, _ := json.Marshal(res)
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write(b)
				return true
			}
			copyTo(w, rr)
			return true
		},
		fails: []string{"return/counts"},
	}, {
		name: "forgets its in-flight count at a second stop-claiming",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, _ http.Handler) bool {
			if r.URL.Path != protocol.StopClaimingPath || r.Method != http.MethodPost || !genuine(r, body) {
				return false
			}
			stops.Lock()
			stops.n++
			n := stops.n
			stops.Unlock()
			if n == 1 { // the first is the real one
				return false
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprint(w, `{"stopping": true, "inFlight": 0, "receiving": 0, "drained": true}`)
			return true
		},
		fails: []string{"stop-claiming/idempotent"},
	}, {
		name:  "keeps its unstarted claims to the drain deadline",
		f:     func(http.ResponseWriter, *http.Request, []byte, http.Handler) bool { return false },
		app:   func(g *goApp) { g.noHandBack = true },
		fails: []string{"stop-claiming/hands-back-unstarted-at-once"},
	}, {
		name:  "reports a runningMillis that does not age",
		f:     drainStatus(func(st *protocol.DrainStatus) { st.RunningMillis = 5 }), // whatever is in progress, and with nothing
		fails: []string{"drain/runningMillis-ages-oldest-claim", "drain/long-poll-returns-when-drained"},
	}, {
		name: "times its claims from later than they started",
		f: drainStatus(func(st *protocol.DrainStatus) {
			if st.RunningMillis > 400 {
				st.RunningMillis -= 400 // from stop-claiming, say
			}
		}),
		fails: []string{"drain/runningMillis-ages-oldest-claim"},
	}, {
		name:  "goes on claiming after a return",
		f:     drainStatus(func(st *protocol.DrainStatus) { st.Stopping = false }), // as an app that never stops says
		fails: []string{"return/stops-claiming"},
	}, {
		name: "reads null as a value, not as absent",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, _ http.Handler) bool {
			if r.Method != http.MethodPut || !bytes.Contains(body, []byte("null")) {
				return false
			}
			writeJSONError(w, http.StatusBadRequest, "body: null is not a value of its field")
			return true
		},
		fails: []string{"json/null-reads-as-absent"},
	}, {
		name: "reads integers as floating point",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) bool {
			if r.Method != http.MethodPut || !strings.HasPrefix(r.URL.Path, protocol.LeasePathPrefix) {
				return false
			}
			var m map[string]any
			if json.Unmarshal(body, &m) != nil {
				return false
			}
			l := protocol.Leadership{Lease: str(m["lease"]), Leader: m["leader"] == true, Sequence: int64(num(m["sequence"])),
				FencingToken: int64(num(m["fencingToken"])), ValidForMillis: int64(num(m["validForMillis"]))}
			if u, err := time.Parse(time.RFC3339Nano, str(m["until"])); err == nil {
				l.Until = u
			}
			if !genuine(r, body) {
				return false
			}
			b, _ := json.Marshal(l)
			resign(r, b)
			copyTo(w, forward(next, r, b))
			return true
		},
		fails: []string{"json/integers-whole-decimal-int64"},
	}, {
		name: "refuses a negative fencing token",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, _ http.Handler) bool {
			if l, ok := leadership(r, body); !ok || l.FencingToken >= 0 {
				return false
			}
			writeJSONError(w, http.StatusUnprocessableEntity, "body: fencingToken is negative")
			return true
		},
		fails: []string{"leadership/negative-fencingToken-applied"},
	}, {
		name: "answers stale before it checks the message",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) bool {
			l, ok := leadership(r, body)
			if !ok || !strings.Contains(r.URL.Path, "-order-") {
				return false
			}
			lease := strings.TrimPrefix(r.URL.Path, protocol.LeasePathPrefix)
			last.Lock()
			defer last.Unlock()
			if l.Sequence <= last.seq[lease] {
				w.Header().Set("Content-Type", "application/json")
				_, _ = fmt.Fprintf(w, `{"leader": %t, "stale": true}`, l.Leader)
				return true
			}
			rr := forward(next, r, body)
			if rr.Code == http.StatusOK {
				last.seq[lease] = l.Sequence
			}
			copyTo(w, rr)
			return true
		},
		fails: []string{"leadership/which-refusal-wins"},
	}, {
		name: "compares the signature's hex case-sensitively",
		f: func(w http.ResponseWriter, r *http.Request, _ []byte, _ http.Handler) bool {
			_, sig, _ := strings.Cut(r.Header.Get("Authorization"), " ")
			if sig == strings.ToLower(sig) {
				return false
			}
			w.Header().Set("WWW-Authenticate", protocol.AuthScheme+` realm="handoff"`)
			writeJSONError(w, http.StatusUnauthorized, "bad signature")
			return true
		},
		fails: []string{"auth/signature-hex-any-case"},
	}, {
		name: "takes any white space after the scheme",
		f: func(_ http.ResponseWriter, r *http.Request, _ []byte, _ http.Handler) bool {
			scheme, sig, ok := strings.Cut(r.Header.Get("Authorization"), " ")
			if ok {
				r.Header.Set("Authorization", scheme+" "+strings.TrimSpace(sig))
			} else if scheme, sig, ok = strings.Cut(r.Header.Get("Authorization"), "\t"); ok {
				r.Header.Set("Authorization", scheme+" "+strings.TrimSpace(sig))
			}
			return false
		},
		fails: []string{"auth/signature-hex-any-case"},
	}, {
		name: "reads waitMillis without form decoding",
		f: func(w http.ResponseWriter, r *http.Request, _ []byte, _ http.Handler) bool {
			if r.URL.Path != protocol.DrainPath {
				return false
			}
			raw := strings.TrimPrefix(r.URL.RawQuery, "waitMillis=")
			if _, err := strconv.ParseUint(raw, 10, 64); err == nil || raw == "" || strings.Contains(raw, "&") || strings.ContainsAny(raw, "-.es") {
				return false
			}
			writeJSONError(w, http.StatusBadRequest, "waitMillis "+raw+": want digits")
			return true
		},
		fails: []string{"bad-request/waitMillis-form-encoded"},
	}, {
		name: "does not percent-decode the Lease segment",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, _ http.Handler) bool {
			l, ok := leadership(r, body)
			raw := strings.TrimPrefix(r.URL.EscapedPath(), protocol.LeasePathPrefix)
			if !ok || l.Lease == "" || l.Lease == raw {
				return false
			}
			writeJSONError(w, http.StatusBadRequest, "body: lease differs from the path's Lease "+raw)
			return true
		},
		fails: []string{"leadership/lease-segment-percent-decoded"},
	}, {
		name:  "answers 413 with the body unread and keeps the connection",
		f:     keepsConnectionAfter413,
		fails: []string{"http/after-413-close-or-read"},
	}, {
		name: "keeps counting claims whose work ended after a return",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) bool {
			if r.URL.Path == protocol.ReturnPath && genuine(r, body) {
				returns.Lock()
				returns.seen[r.Header.Get(protocol.NonceHeader)] = true
				returns.Unlock()
				return false
			}
			if r.URL.Path != protocol.DrainPath {
				return false
			}
			returns.Lock()
			after := len(returns.seen) > 0
			returns.Unlock()
			if !after {
				return false
			}
			return drainStatus(func(st *protocol.DrainStatus) { st.InFlight, st.Drained = 1, false })(w, r, body, next)
		},
		fails: []string{"return/in-flight-until-work-ends"},
	}, {
		name: "reads a grant without until as over on arrival",
		f: func(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) bool {
			l, ok := leadership(r, body)
			if !ok || !l.Leader || !l.Until.IsZero() {
				return false
			}
			if !genuine(r, body) {
				return false
			}
			l.ValidForMillis = 0 // until: the zero time, long past
			b, _ := json.Marshal(l)
			resign(r, b)
			copyTo(w, forward(next, r, b))
			return true
		},
		fails: []string{"leadership/grant-without-until"},
	}, {
		name: "a fixture whose stopping says yes without leader work",
		f:    func(http.ResponseWriter, *http.Request, []byte, http.Handler) bool { return false },
		leader: func(l conformance.LeaderFixture) conformance.LeaderFixture {
			return &allOfNone{LeaderFixture: l, led: map[string]bool{}}
		},
		fails: []string{"fixture/stopping-without-leader-work-says-no"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			app := newGoApp(t)
			if tc.app != nil {
				tc.app(app)
			}
			leader := conformance.AgentLeader(app.current)
			if tc.leader != nil {
				leader = tc.leader(leader)
			}
			rep := serveWith(t, app, broken(app, tc.f), leader)
			for _, name := range tc.fails {
				c, ok := rep.Case(name)
				if !ok || c.Result != conformance.Fail {
					t.Errorf("%s = %s (%s), want fail", name, c.Result, c.Reason)
				}
			}
		})
	}
}

// An app whose socket only its own user can open (mode 0600: the sidecar,
// another user, could not connect) fails transport/socket; a symbolic link
// to the socket fails every case, as the sidecar follows none.
func TestSocketCase(t *testing.T) {
	app := newGoApp(t)
	addr := serveApp(t, app)
	e, _ := protocol.ParseEndpoint(addr)
	if err := os.Chmod(e.Address, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep := conformance.Run(ctx, conformance.Target{URL: addr, Token: testToken})
	if c, _ := rep.Case("transport/socket"); c.Result != conformance.Fail || !strings.Contains(c.Reason, "mode 600") {
		t.Errorf("socket of mode 0600: %s (%s), want fail naming the mode", c.Result, c.Reason)
	}
	link := filepath.Join(filepath.Dir(e.Address), "link.sock")
	if err := os.Symlink(e.Address, link); err != nil {
		t.Fatal(err)
	}
	rep = conformance.Run(ctx, conformance.Target{URL: "unix://" + link, Token: testToken})
	// The suite, as the sidecar, does not connect through the link at all.
	if c, _ := rep.Case("transport/socket"); c.Result != conformance.Fail || !strings.Contains(c.Reason, "not a socket") {
		t.Errorf("a link to the socket: %s (%s), want fail", c.Result, c.Reason)
	}
}

// stopsAtABadReturn is an app that stops its claiming when a return's body
// is not JSON (it answers 400 all the same): the case that sends it,
// bad-request/return-body, fails, and the cases after it do not pay for
// it: with a Fixture the suite restarts the app before the next; without
// one the next is skipped, not failed (seen: bad-request/unknown-path-or-
// method failed for an app an earlier case had stopped).
func stopsAtABadReturn(app *goApp) http.Handler {
	return broken(app, func(_ http.ResponseWriter, r *http.Request, body []byte, _ http.Handler) bool {
		if r.URL.Path == protocol.ReturnPath && r.Method == http.MethodPost && !json.Valid(body) {
			app.current().StopClaiming()
		}
		return false
	})
}

func TestACaseThatStopsTheAppFailsItselfNotTheNext(t *testing.T) {
	app := newGoApp(t)
	rep := serve(t, app, stopsAtABadReturn(app))
	if c, _ := rep.Case("bad-request/return-body"); c.Result != conformance.Fail || !strings.Contains(c.Reason, "says stopping after this case's calls") {
		t.Errorf("%s = %s (%s), want fail: its calls stopped the app", "bad-request/return-body", c.Result, c.Reason)
	}
	for _, name := range []string{"bad-request/leadership-body", "bad-request/unknown-path-or-method", "leadership/not-genuine-refused-422"} {
		if c, _ := rep.Case(name); c.Result != conformance.Pass {
			t.Errorf("with a Fixture, %s = %s (%s), want pass on the restarted app", name, c.Result, c.Reason)
		}
	}

	// Without a Fixture the suite cannot restart it: the next cases are
	// skipped, saying why.
	noFixture := newGoApp(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep = conformance.Run(ctx, conformance.Target{URL: serveApp(t, stopsAtABadReturn(noFixture)), Token: testToken})
	t.Logf("\n%s", rep)
	if c, _ := rep.Case("bad-request/return-body"); c.Result != conformance.Fail {
		t.Errorf("without a Fixture, %s = %s (%s), want fail", "bad-request/return-body", c.Result, c.Reason)
	}
	if c, _ := rep.Case("bad-request/unknown-path-or-method"); c.Result != conformance.Skip || !strings.Contains(c.Reason, "stopping before this case") {
		t.Errorf("without a Fixture, %s = %s (%s), want skip: the app was stopped by an earlier case", "bad-request/unknown-path-or-method", c.Result, c.Reason)
	}
}

// The report as JSON and as JUnit XML: every case, its result and reason.
func TestReportOutputs(t *testing.T) {
	rep := conformance.Report{Cases: []conformance.Case{
		{Name: "auth/unsigned-refused", Result: conformance.Pass, Reason: "refused", Duration: 12 * time.Millisecond},
		{Name: "return/counts", Result: conformance.Fail, Reason: "returned 0, want 3 <&>", Duration: time.Second},
		{Name: "leadership/term-ends-at-until", Result: conformance.Skip, Reason: "needs a LeaderFixture"},
	}}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Cases []struct {
			Name, Result, Reason string
			Seconds              float64
		}
		Passed, Failed, Skipped int
	}
	if err := json.Unmarshal(js.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, js.String())
	}
	if got.Passed != 1 || got.Failed != 1 || got.Skipped != 1 || len(got.Cases) != 3 || got.Cases[1].Result != "fail" ||
		got.Cases[1].Reason != "returned 0, want 3 <&>" || got.Cases[1].Seconds != 1 || got.Cases[0].Seconds != 0.012 {
		t.Errorf("WriteJSON:\n%s", js.String())
	}

	var x bytes.Buffer
	if err := rep.WriteJUnit(&x, "handoff conformance"); err != nil {
		t.Fatal(err)
	}
	var suites struct {
		Suites []struct {
			Name     string `xml:"name,attr"`
			Tests    int    `xml:"tests,attr"`
			Failures int    `xml:"failures,attr"`
			Skipped  int    `xml:"skipped,attr"`
			Cases    []struct {
				Class   string `xml:"classname,attr"`
				Name    string `xml:"name,attr"`
				Failure *struct {
					Message string `xml:"message,attr"`
				} `xml:"failure"`
				Skipped *struct{} `xml:"skipped"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(x.Bytes(), &suites); err != nil {
		t.Fatalf("%v\n%s", err, x.String())
	}
	if len(suites.Suites) != 1 {
		t.Fatalf("WriteJUnit: %d test suites, want 1:\n%s", len(suites.Suites), x.String())
	}
	s := suites.Suites[0]
	if s.Name != "handoff conformance" || s.Tests != 3 || s.Failures != 1 || s.Skipped != 1 || len(s.Cases) != 3 ||
		s.Cases[1].Class != "handoff.conformance.return" || s.Cases[1].Failure == nil || s.Cases[1].Failure.Message != "returned 0, want 3 <&>" ||
		s.Cases[2].Skipped == nil || s.Cases[0].Failure != nil || s.Cases[0].Skipped != nil {
		t.Errorf("WriteJUnit:\n%s", x.String())
	}
}

func writeJSONError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	b, _ := json.Marshal(map[string]string{"error": msg})
	_, _ = w.Write(b)
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func num(v any) float64 {
	f, _ := v.(float64)
	return f
}

// keepsConnectionAfter413 is a broken app that answers a body over 64 KiB
// 413 without reading it, keeps the connection, and reads the rest of the
// body as the next call, as a Python http.server app did.
func keepsConnectionAfter413(w http.ResponseWriter, r *http.Request, _ []byte, _ http.Handler) bool {
	if r.ContentLength <= worker.MaxBodyBytes {
		return false
	}
	// broken has read the body already: put back what it would not have
	// read, and answer on the raw connection.
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return false
	}
	go func() {
		defer func() { _ = conn.Close() }()
		rest := io.MultiReader(strings.NewReader(strings.Repeat("x", int(r.ContentLength)-worker.MaxBodyBytes)), buf)
		msg := `{"error": "body: larger than 65536 bytes"}`
		_, _ = fmt.Fprintf(conn, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(msg), msg)
		if _, err := http.ReadRequest(bufio.NewReader(rest)); err != nil {
			msg = `{"error": "malformed HTTP request"}`
			_, _ = fmt.Fprintf(conn, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(msg), msg)
		}
		_, _ = io.Copy(io.Discard, conn) // until the client hangs up
	}()
	return true
}

// allOfNone is a broken LeaderFixture: its stopping says yes for a Lease
// with no leader work begun (all of none has stopped), as a fixture that
// checks that no work it knows of still runs might.
type allOfNone struct {
	conformance.LeaderFixture
	mu  sync.Mutex
	led map[string]bool
}

func (a *allOfNone) Lead(ctx context.Context, lease string) (bool, error) {
	a.mu.Lock()
	a.led[lease] = true
	a.mu.Unlock()
	return a.LeaderFixture.Lead(ctx, lease)
}

func (a *allOfNone) Stopping(ctx context.Context, lease string) (bool, error) {
	a.mu.Lock()
	led := a.led[lease]
	a.mu.Unlock()
	if !led {
		return true, nil
	}
	return a.LeaderFixture.Stopping(ctx, lease)
}
