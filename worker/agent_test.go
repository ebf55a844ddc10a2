package worker_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"io"
	"net"
	"net/http"
	"sync"

	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/worker"
)

func TestStopClaimingOnlyShrinksClaims(t *testing.T) {
	a := newAgent(t, worker.Options{})
	app := serve(t, a)
	_, done, err := a.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	st, err := app.StopClaiming(context.Background())
	if err != nil || !st.Stopping || st.InFlight != 1 || st.Drained {
		t.Fatalf("stop-claiming = %+v, %v", st, err)
	}
	select {
	case <-a.Stopping():
	default:
		t.Fatal("Stopping not closed")
	}
	if _, _, err := a.Begin(context.Background()); !errors.Is(err, worker.ErrStopping) {
		t.Fatalf("Begin after stop = %v, want ErrStopping", err)
	}
	go func() { time.Sleep(50 * time.Millisecond); done(); done() }() // done is idempotent
	st, err = app.Drain(context.Background(), 5*time.Second)
	if err != nil || !st.Drained || st.InFlight != 0 {
		t.Fatalf("drain = %+v, %v", st, err)
	}
}

func TestDrainLongPollEndsAtWait(t *testing.T) {
	a := newAgent(t, worker.Options{})
	app := serve(t, a)
	if _, _, err := a.Begin(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := app.Drain(context.Background(), 50*time.Millisecond)
	if err != nil || st.Drained || st.InFlight != 1 {
		t.Fatalf("drain = %+v, %v: want 1 in flight", st, err)
	}
}

func TestReturnWithCancelCancelsThenReturns(t *testing.T) {
	var inFlightAtReturn int
	var a *worker.Agent
	a = newAgent(t, worker.Options{ReturnClaims: func(context.Context) (int, error) {
		inFlightAtReturn = a.InFlight()
		return 2, nil
	}})
	app := serve(t, a)
	for range 2 {
		ctx, done, err := a.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		go func() { <-ctx.Done(); done() }()
	}
	res, err := app.Return(context.Background(), true, time.Second)
	if err != nil || res.Returned != 2 {
		t.Fatalf("return = %+v, %v", res, err)
	}
	if inFlightAtReturn != 0 {
		t.Errorf("ReturnClaims ran with %d in flight, want 0 after cancel", inFlightAtReturn)
	}
}

// newFake returns an Agent on a fake clock, served over HTTP.
func newFake(t *testing.T) (*worker.Agent, *clocktesting.FakeClock, *protocol.AppClient) {
	fake := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC))
	a := newAgent(t, worker.Options{Clock: fake})
	return a, fake, serve(t, a)
}

// waitDone fails t unless ctx ends soon: a fake clock ended the term, and
// the derived context follows in its own goroutine.
func waitDone(ctx context.Context, t *testing.T, what string) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal(what)
	}
}

func TestLeadershipEndsOnTheAppsOwnClock(t *testing.T) {
	a, fake, app := newFake(t)
	until := fake.Now().Add(150 * time.Millisecond)
	if err := app.SetLeadership(context.Background(), protocol.Leadership{Lease: "l", Leader: true, FencingToken: 7, Until: until, ValidForMillis: 60000}); err != nil {
		t.Fatal(err)
	}
	ctx, l, done, err := a.BeginLeading(context.Background(), "l")
	if err != nil || l.FencingToken != 7 || !l.Until.Equal(until) {
		t.Fatalf("BeginLeading = %+v, %v", l, err)
	}
	defer done()
	fake.Step(149 * time.Millisecond)
	if _, ok := a.Leader("l"); !ok || ctx.Err() != nil {
		t.Fatalf("not leader 1ms before until: leader %v, context %v", ok, ctx.Err())
	}
	fake.Step(time.Millisecond)
	waitDone(ctx, t, "leader context did not end when the term ran out")
	if _, ok := a.Leader("l"); ok {
		t.Error("still leader after the term ran out with no renewal")
	}
	if _, _, _, err := a.BeginLeading(context.Background(), "l"); !errors.Is(err, worker.ErrNotLeader) {
		t.Errorf("BeginLeading after expiry = %v, want ErrNotLeader", err)
	}
}

// validForMillis counts from receipt on the Agent's clock, and a renewal
// moves the end of the term.
func TestValidForCountsFromReceiptAndRenewalExtends(t *testing.T) {
	a, fake, app := newFake(t)
	grant := func(seq int64, validFor time.Duration) {
		t.Helper()
		l := protocol.Leadership{Lease: "l", Leader: true, Sequence: seq, FencingToken: 1,
			Until: fake.Now().Add(time.Hour), ValidForMillis: validFor.Milliseconds()}
		if err := app.SetLeadership(context.Background(), l); err != nil {
			t.Fatal(err)
		}
	}
	grant(1, 100*time.Millisecond)
	ctx, lead, done, err := a.BeginLeading(context.Background(), "l")
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	if want := fake.Now().Add(100 * time.Millisecond); !lead.Until.Equal(want) {
		t.Fatalf("Until = %v, want receipt + validForMillis = %v", lead.Until, want)
	}
	fake.Step(60 * time.Millisecond)
	grant(2, 100*time.Millisecond) // renewed: now ends at +160ms
	fake.Step(60 * time.Millisecond)
	if _, ok := a.Leader("l"); !ok || ctx.Err() != nil {
		t.Fatalf("renewed term ended at the first grant's end: leader %v, context %v", ok, ctx.Err())
	}
	fake.Step(40 * time.Millisecond)
	waitDone(ctx, t, "leader context did not end at the renewed term's end")
	if _, ok := a.Leader("l"); ok {
		t.Error("still leader after the renewed term ran out")
	}
}

func TestRevokeIsAnsweredAfterLeaderWorkStops(t *testing.T) {
	a, fake, app := newFake(t)
	grant := protocol.Leadership{Lease: "l", Leader: true, Sequence: 1, FencingToken: 1, Until: fake.Now().Add(time.Minute), ValidForMillis: 60000}
	if err := app.SetLeadership(context.Background(), grant); err != nil {
		t.Fatal(err)
	}
	ctx, _, done, err := a.BeginLeading(context.Background(), "l")
	if err != nil {
		t.Fatal(err)
	}
	var stopped atomic.Bool
	go func() { <-ctx.Done(); stopped.Store(true); done() }()
	if err := app.SetLeadership(context.Background(), protocol.Leadership{Lease: "l", Sequence: 2}); err != nil {
		t.Fatal(err)
	}
	if !stopped.Load() {
		t.Fatal("revoke answered before the leader work stopped")
	}
	// A grant delayed past the revoke is ignored, and says so.
	if err := app.SetLeadership(context.Background(), grant); !errors.Is(err, protocol.ErrStale) {
		t.Fatalf("stale grant = %v, want protocol.ErrStale", err)
	}
	if _, ok := a.Leader("l"); ok {
		t.Fatal("a stale grant (sequence 1 after 2) made the app leader again")
	}
	// Leader work that never stops: the revoke fails when its deadline ends.
	grant.Sequence = 3
	if err := app.SetLeadership(context.Background(), grant); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := a.BeginLeading(context.Background(), "l"); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := app.SetLeadership(rctx, protocol.Leadership{Lease: "l", Sequence: 4}); err == nil {
		t.Fatal("revoke acknowledged although leader work did not stop")
	}
}

// A grant valid for longer than any term (here of any size, up to the
// largest) is refused, not applied: neither overflowed into a term already
// over nor taken for a term beyond the lease duration.
func TestHugeValidForIsRefused(t *testing.T) {
	a, fake, app := newFake(t)
	until := fake.Now().Add(time.Minute)
	for _, v := range []int64{math.MaxInt64, time.Hour.Milliseconds() + 1} {
		l := protocol.Leadership{Lease: "l", Leader: true, Sequence: 1, FencingToken: 1, Until: until, ValidForMillis: v}
		if err := app.SetLeadership(context.Background(), l); err == nil || !strings.Contains(err.Error(), "422") || !strings.Contains(err.Error(), "validForMillis") {
			t.Fatalf("validForMillis %d: %v; want 422 naming validForMillis", v, err)
		}
		if lead, ok := a.Leader("l"); ok {
			t.Fatalf("validForMillis %d: Leader = %+v; want no leadership", v, lead)
		}
	}
}

// ListenAndServe's server cuts off a client that sends its request a byte
// at a time, signed or not (the server closes the connection: the body is
// read, under the read timeout, before the signature is checked), but not
// a signed long poll that waits past its read and write
// timeouts: the poll still answers when the claim it waits for is done.
func TestServerCutsOffSlowClientsNotLongPolls(t *testing.T) {
	a := newAgent(t, worker.Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.ListenAndServe(ctx, addr) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("ListenAndServe: %v", err)
		}
	}()
	dial := func() net.Conn {
		for {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				return c
			}
			select {
			case err := <-served:
				t.Fatalf("ListenAndServe: %v", err)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	for _, auth := range []string{"", "Authorization: " + protocol.AuthScheme + " " + strings.Repeat("0", 64) + "\r\n"} {
		conn := dial()
		_, _ = io.WriteString(conn, "PUT "+protocol.LeasePathPrefix+"work HTTP/1.1\r\nHost: app\r\n"+auth+"Content-Length: 1000\r\n\r\n{")
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // one byte every 100ms, until the server closes
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				if _, err := io.WriteString(conn, " "); err != nil {
					return
				}
			}
		}()
		_ = conn.SetReadDeadline(time.Now().Add(time.Minute)) // the test's bound, far beyond the server's
		_, err := io.Copy(io.Discard, conn)
		close(stop)
		wg.Wait()
		_ = conn.Close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("%q: the connection was still open after a minute of a byte every 100ms; want the server to close it", auth)
		}
	}

	_, done, err := a.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	answered := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+protocol.DrainPath+"?waitMillis=30000", nil)
		sign(req, "")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		answered <- string(b)
	}()
	time.Sleep(11 * time.Second) // past the server's read (5s) and write (10s) timeouts
	done()
	if body := <-answered; !strings.Contains(body, `"drained":true`) {
		t.Errorf("a long poll past the server's timeouts answered %q; want it to wait for the claim and answer drained", body)
	}
}
