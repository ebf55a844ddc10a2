package worker_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/worker"
)

// A batch of three held unstarted, one started: stop-claiming (over HTTP,
// as the sidecar calls it) hands back exactly the two unstarted at once,
// through HandBack, and refuses to start them; the started one drains.
func TestStopClaimingHandsBackUnstartedClaimsAtOnce(t *testing.T) {
	handedBack := make(chan []any, 4)
	a := newAgent(t, worker.Options{
		HandBack: func(_ context.Context, claims []*worker.Claim) error {
			var vs []any
			for _, c := range claims {
				vs = append(vs, c.Value())
			}
			handedBack <- vs
			return nil
		},
		ReturnClaims: func(context.Context) (int, error) {
			t.Error("ReturnClaims called: the drain deadline's fallback is not this test's")
			return 0, nil
		},
	})
	app := serve(t, a)
	r, err := a.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	batch := []*worker.Claim{r.HoldUnstarted(1), r.HoldUnstarted(2), r.HoldUnstarted(3)}
	r.End()
	if err := batch[0].Start(); err != nil {
		t.Fatalf("Start before stop-claiming = %v, want nil", err)
	}
	st, err := app.Drain(context.Background(), 0)
	if err != nil || st.InFlight != 3 || st.Unstarted != 2 || st.Drained {
		t.Fatalf("drain before stop-claiming = %+v, %v: want 3 in flight, 2 of them unstarted", st, err)
	}

	if _, err := app.StopClaiming(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, c := range batch[1:] {
		if err := c.Start(); !errors.Is(err, worker.ErrHandedBack) {
			t.Fatalf("Start of claim %v after stop-claiming = %v, want ErrHandedBack", c.Value(), err)
		}
		c.Done() // the app's, on a claim taken: nothing
	}
	select {
	case vs := <-handedBack:
		slices.SortFunc(vs, func(x, y any) int { return x.(int) - y.(int) })
		if !slices.Equal(vs, []any{2, 3}) {
			t.Fatalf("handed back %v, want exactly the unstarted claims [2 3]", vs)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("stop-claiming did not hand back the unstarted claims")
	}
	if err := batch[0].Context().Err(); err != nil {
		t.Fatalf("the started claim's context ended at stop-claiming: %v", err)
	}
	if err := batch[0].Start(); err != nil {
		t.Fatalf("Start of the started claim after stop-claiming = %v, want nil", err)
	}
	// The started claim alone is left: once it is done the worker is
	// drained, so the handed-back claims were ended by the Agent.
	batch[0].Done()
	st, err = app.Drain(context.Background(), 30*time.Second)
	if err != nil || !st.Drained || st.InFlight != 0 || st.Unstarted != 0 {
		t.Fatalf("drain after the started claim was done = %+v, %v: want drained", st, err)
	}
	if err := batch[0].Start(); !errors.Is(err, worker.ErrClaimDone) {
		t.Fatalf("Start after Done = %v, want ErrClaimDone", err)
	}
	if len(handedBack) != 0 {
		t.Fatalf("HandBack called again with %v", <-handedBack)
	}
}

// A message held unstarted after stop-claiming (received in the race with
// it) is handed back too; a failed hand-back leaves the claims held until
// the drain deadline's Return ends them after ReturnClaims.
func TestUnstartedAfterStopClaimingAndFailedHandBack(t *testing.T) {
	calls := make(chan []*worker.Claim, 4)
	returned := make(chan struct{}, 1)
	a := newAgent(t, worker.Options{
		HandBack: func(_ context.Context, claims []*worker.Claim) error {
			calls <- claims
			return errors.New("queue unreachable")
		},
		ReturnClaims: func(context.Context) (int, error) { returned <- struct{}{}; return 1, nil },
	})
	app := serve(t, a)
	r, err := a.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := app.StopClaiming(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := r.HoldUnstarted("late")
	r.End()
	if err := c.Start(); !errors.Is(err, worker.ErrHandedBack) {
		t.Fatalf("Start of a claim held unstarted after stop-claiming = %v, want ErrHandedBack", err)
	}
	select {
	case got := <-calls:
		if len(got) != 1 || got[0].Value() != "late" {
			t.Fatalf("HandBack got %d claims, want the one held late", len(got))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a claim held unstarted after stop-claiming was not handed back")
	}
	if st, err := app.Drain(context.Background(), 10*time.Millisecond); err != nil || st.Drained || st.Unstarted != 1 {
		t.Fatalf("drain after a failed hand-back = %+v, %v: want the claim still held, unstarted", st, err)
	}
	if res, err := app.Return(context.Background(), false, 0); err != nil || res.Returned != 1 {
		t.Fatalf("return = %+v, %v", res, err)
	}
	<-returned
	if st, err := app.Drain(context.Background(), 30*time.Second); err != nil || !st.Drained {
		t.Fatalf("drain after the fallback = %+v, %v: want drained", st, err)
	}
}

// The drain status times the work in progress: runningMillis is the age of
// the oldest claim started (Hold, Begin, or Start of one held unstarted),
// on the Agent's clock; an unstarted claim does not count until started,
// and a claim done no longer counts.
func TestDrainStatusTimesTheOldestWorkInProgress(t *testing.T) {
	a, fake, app := newFake(t)
	running := func() int64 {
		t.Helper()
		st, err := app.Drain(context.Background(), 0)
		if err != nil {
			t.Fatal(err)
		}
		return st.RunningMillis
	}
	if got := running(); got != 0 {
		t.Fatalf("runningMillis with no claim = %d, want 0", got)
	}
	r, err := a.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	later := r.HoldUnstarted("later")
	first := r.Hold()
	r.End()
	fake.Step(1500 * time.Millisecond)
	if got := running(); got != 1500 {
		t.Fatalf("runningMillis 1.5s after Hold = %d, want 1500", got)
	}
	if err := later.Start(); err != nil {
		t.Fatal(err)
	}
	fake.Step(time.Second)
	if got := running(); got != 2500 {
		t.Fatalf("runningMillis with the first claim 2.5s old = %d, want 2500 (the oldest)", got)
	}
	first.Done()
	if got := running(); got != 1000 {
		t.Fatalf("runningMillis once the oldest is done = %d, want 1000 (the claim started 1s ago)", got)
	}
	later.Done()
	if got := running(); got != 0 {
		t.Fatalf("runningMillis with every claim done = %d, want 0", got)
	}
}
