package worker_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/protocol"
	"github.com/handoff-dev/handoff/sidecar"
	"github.com/handoff-dev/handoff/worker"
)

func serve(t *testing.T, a *worker.Agent) *sidecar.AppClient {
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	return sidecar.NewAppClient(srv.URL)
}

func TestStopClaimingOnlyShrinksClaims(t *testing.T) {
	a := worker.New(worker.Options{})
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
	a := worker.New(worker.Options{})
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
	a = worker.New(worker.Options{ReturnClaims: func(context.Context) (int, error) {
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

func TestLeadershipEndsOnTheAppsOwnClock(t *testing.T) {
	a := worker.New(worker.Options{})
	app := serve(t, a)
	until := time.Now().Add(150 * time.Millisecond)
	if err := app.SetLeadership(context.Background(), protocol.Leadership{Lease: "l", Leader: true, FencingToken: 7, Until: until, ValidForMillis: 150}); err != nil {
		t.Fatal(err)
	}
	ctx, l, done, err := a.BeginLeading(context.Background(), "l")
	if err != nil || l.FencingToken != 7 {
		t.Fatalf("BeginLeading = %+v, %v", l, err)
	}
	defer done()
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("leader context did not end when the term ran out")
	}
	if _, ok := a.Leader("l"); ok {
		t.Error("still leader after the term ran out with no renewal")
	}
	if _, _, _, err := a.BeginLeading(context.Background(), "l"); !errors.Is(err, worker.ErrNotLeader) {
		t.Errorf("BeginLeading after expiry = %v, want ErrNotLeader", err)
	}
}

func TestRevokeIsAnsweredAfterLeaderWorkStops(t *testing.T) {
	a := worker.New(worker.Options{})
	app := serve(t, a)
	grant := protocol.Leadership{Lease: "l", Leader: true, Sequence: 1, FencingToken: 1, Until: time.Now().Add(time.Minute), ValidForMillis: 60000}
	if err := app.SetLeadership(context.Background(), grant); err != nil {
		t.Fatal(err)
	}
	ctx, _, done, err := a.BeginLeading(context.Background(), "l")
	if err != nil {
		t.Fatal(err)
	}
	var stopped time.Time
	go func() { <-ctx.Done(); time.Sleep(100 * time.Millisecond); stopped = time.Now(); done() }()
	if err := app.SetLeadership(context.Background(), protocol.Leadership{Lease: "l", Sequence: 2}); err != nil {
		t.Fatal(err)
	}
	if stopped.IsZero() || time.Since(stopped) < 0 {
		t.Fatal("revoke answered before the leader work stopped")
	}
	// A grant delayed past the revoke is ignored, and says so.
	if err := app.SetLeadership(context.Background(), grant); !errors.Is(err, sidecar.ErrStale) {
		t.Fatalf("stale grant = %v, want ErrStale", err)
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

func TestBadRequestsAreRefused(t *testing.T) {
	srv := httptest.NewServer(worker.New(worker.Options{}).Handler())
	defer srv.Close()
	for _, path := range []string{protocol.DrainPath + "?waitMillis=soon", protocol.DrainPath + "?waitMillis=-1"} {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("GET %s = %d, want 400", path, resp.StatusCode)
		}
	}
}
