package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/worker"
)

// A pending receive holds no claim: it is counted apart from the claims in
// flight, and stop-claiming ends its context before it answers.
func TestReceiveIsNotInFlightAndEndsAtStopClaiming(t *testing.T) {
	a := newAgent(t, worker.Options{})
	app := serve(t, a)
	r, err := a.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	st, err := app.Drain(context.Background(), 0)
	if err != nil || st.InFlight != 0 || st.Receiving != 1 || st.Drained {
		t.Fatalf("drain while receiving = %+v, %v: want 0 in flight, 1 receiving, not drained", st, err)
	}
	if a.InFlight() != 0 {
		t.Fatalf("InFlight = %d while only receiving, want 0", a.InFlight())
	}
	st, err = app.StopClaiming(context.Background())
	if err != nil || !st.Stopping || st.InFlight != 0 {
		t.Fatalf("stop-claiming = %+v, %v", st, err)
	}
	// Ended by the time stop-claiming answered, not some time later.
	if err := r.Context().Err(); err == nil {
		t.Fatal("the receive's context did not end at stop-claiming")
	}
	if cause := context.Cause(r.Context()); !errors.Is(cause, worker.ErrStopping) {
		t.Fatalf("cause = %v, want ErrStopping", cause)
	}
	if _, err := a.Receive(context.Background()); !errors.Is(err, worker.ErrStopping) {
		t.Fatalf("Receive after stop-claiming = %v, want ErrStopping", err)
	}
	r.End()
	r.End() // idempotent
	st, err = app.Drain(context.Background(), 0)
	if err != nil || !st.Drained || st.Receiving != 0 {
		t.Fatalf("drain after the receive ended = %+v, %v: want drained", st, err)
	}
}

// The pattern of a worker idle in a long poll: the sidecar's drain long
// poll sees it drained as soon as stop-claiming ends the wait, not at its
// wait's end.
func TestIdleLongPollIsDrainedOnceStopClaimingEndsIt(t *testing.T) {
	a := newAgent(t, worker.Options{})
	app := serve(t, a)
	waiting := make(chan struct{})
	go func() {
		r, err := a.Receive(context.Background())
		if err != nil {
			t.Error(err)
			return
		}
		close(waiting)
		select { // a long poll with nothing to receive
		case <-r.Context().Done():
		case <-time.After(time.Hour):
		}
		r.End()
	}()
	<-waiting
	if _, err := app.StopClaiming(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := app.Drain(context.Background(), 30*time.Second)
	if err != nil || !st.Drained {
		t.Fatalf("drain = %+v, %v: want drained once the long poll ended", st, err)
	}
}

// A message received in the race with stop-claiming is held: the drain
// waits for it, the return fallback hands it back, and its context is not
// ended by stop-claiming (the work goes on).
func TestMessageReceivedInTheRaceWithStopClaimingIsHeld(t *testing.T) {
	var inFlightAtReturn int
	var a *worker.Agent
	a = newAgent(t, worker.Options{ReturnClaims: func(context.Context) (int, error) {
		inFlightAtReturn = a.InFlight()
		return inFlightAtReturn, nil
	}})
	app := serve(t, a)
	r, err := a.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := app.StopClaiming(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := r.Hold() // the long poll had the message already
	r.End()
	if err := c.Context().Err(); err != nil {
		t.Fatalf("a held claim's context ended with stop-claiming: %v", err)
	}
	st, err := app.Drain(context.Background(), 10*time.Millisecond)
	if err != nil || st.Drained || st.InFlight != 1 || st.Receiving != 0 {
		t.Fatalf("drain = %+v, %v: want the claim held in the race in flight", st, err)
	}
	res, err := app.Return(context.Background(), false, 0)
	if err != nil || res.Returned != 1 || inFlightAtReturn != 1 {
		t.Fatalf("return = %+v, %v (in flight then %d): want the claim handed back", res, err, inFlightAtReturn)
	}
	c.Done()
	c.Done() // idempotent
	if err := c.Context().Err(); err == nil {
		t.Error("a claim's context goes on after Done")
	}
	if st, err := app.Drain(context.Background(), 0); err != nil || !st.Drained {
		t.Fatalf("drain after Done = %+v, %v", st, err)
	}
}

// A receive that gets several messages (a batch) holds each; the drain
// counts them all.
func TestBatchReceiveHoldsEachMessage(t *testing.T) {
	a := newAgent(t, worker.Options{})
	r, err := a.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	claims := []*worker.Claim{r.Hold(), r.Hold(), r.Hold()}
	r.End()
	if n := a.InFlight(); n != 3 {
		t.Fatalf("InFlight = %d, want 3", n)
	}
	for _, c := range claims {
		c.Done()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.WaitDrained(ctx); err != nil {
		t.Fatalf("WaitDrained = %v after every claim was done", err)
	}
}

// The cancel fallback ends held claims' contexts with ErrCanceled.
func TestCancelFallbackEndsClaimsWithErrCanceled(t *testing.T) {
	a := newAgent(t, worker.Options{})
	app := serve(t, a)
	r, err := a.Receive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c := r.Hold()
	r.End()
	go func() { <-c.Context().Done(); c.Done() }()
	if _, err := app.StopClaiming(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := app.Return(context.Background(), true, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if cause := context.Cause(c.Context()); !errors.Is(cause, worker.ErrCanceled) {
		t.Fatalf("cause = %v, want ErrCanceled", cause)
	}
	if n := a.InFlight(); n != 0 {
		t.Fatalf("InFlight = %d after the canceled claim was done", n)
	}
}

func TestReceiveRefusesAnEndedContext(t *testing.T) {
	a := newAgent(t, worker.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Receive(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Receive(ended ctx) = %v, want context.Canceled", err)
	}
	if err := a.WaitDrained(context.Background()); err != nil {
		t.Fatalf("a refused Receive left something pending: %v", err)
	}
}
